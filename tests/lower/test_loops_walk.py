"""The one traversal of the loop IR (lower/loops/walk.py).

Every node type of loops/ir.py is built with a distinct marker in each field that can hold
a node (read from the dataclass annotations, so a field added later is covered without
editing this file); the walk must reach every marker.  Then the queries the passes decide
buffer roles, donation and atomics from are checked on a Matmul with an epilogue, a
Reduce and a shared subexpression."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from tracecomp.core import dtypes as dt
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.walk import (CHILDREN, buffers_read, buffers_written, children,
                                        count_exprs, fingerprint, loads, rename_buffer, size_params,
                                        statements, substitute, var_names, walk)

F32 = dt.FLOAT32
NODE_TYPES = [c for c in vars(L).values()
              if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == L.__name__]


class Markers:
    """Distinct marker nodes, remembered, to fill a field by its annotation."""

    def __init__(self):
        self.made: list = []
        self.count = itertools.count()

    def var(self) -> L.Var:
        v = L.Var(f"m{next(self.count)}", L.INDEX)
        self.made.append(v)
        return v

    def value(self, annotation: str):
        a = annotation.replace("'", "").replace('"', "")
        if a.startswith("Optional["):
            a = a[len("Optional["):-1]
        if a.startswith(("tuple[", "list[")):
            inner = a[a.index("[") + 1:-1].split(",")[0].strip()
            seq = tuple if a.startswith("tuple") else list
            return seq(self.value(inner) for _ in range(2))
        if a == "list":                                   # a statement body
            return [L.Let(f"let{next(self.count)}", self.var())]
        if a in ("Expr", "Size"):
            return self.var()
        if a == "View":
            return L.View(f"buf{next(self.count)}", self.var(), (self.var(), self.var()))
        if a == "Windows":
            return L.Windows(f"buf{next(self.count)}", self.var(), (1,), (1,), (1,), (1,), (1,))
        if a == "int":                                    # Windows' static shapes and strides
            return 1
        if a == "Accumulator":
            return L.Accumulator(f"acc{next(self.count)}", F32, self.var())
        if a == "Buffer":
            return L.Buffer(f"buf{next(self.count)}", F32, (self.var(),), "input")
        if a == "str" or a.startswith("Union[int, float"):
            return f"s{next(self.count)}"
        if a in ("DType", "Union[DType, str]"):
            return F32
        if a == "bool":
            return False
        raise AssertionError(f"test_loops_walk does not know how to fill a field of type {annotation}")


def build(cls, markers: Markers):
    return cls(**{f.name: markers.value(f.type) for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("cls", NODE_TYPES, ids=lambda c: c.__name__)
def test_the_walk_reaches_every_child_of_every_node_type(cls):
    assert cls in CHILDREN, f"{cls.__name__} is not in walk.CHILDREN"
    markers = Markers()
    node = build(cls, markers)
    seen = {id(n) for n in walk(node)}
    missed = [m.name for m in markers.made if id(m) not in seen]
    assert not missed, f"walk({cls.__name__}) misses {missed}: a field is not listed in walk.CHILDREN"
    assert var_names(node) >= {m.name for m in markers.made}


@pytest.mark.parametrize("cls", NODE_TYPES, ids=lambda c: c.__name__)
def test_children_lists_only_real_fields(cls):
    names = {f.name for f in dataclasses.fields(cls)}
    assert set(CHILDREN[cls]) <= names


def test_an_unknown_node_is_an_error_not_a_leaf():
    with pytest.raises(TypeError, match="not a loop-IR node"):
        list(walk([L.Let("x", "oops")]))


# ----------------------------------------------------------------------------- queries

def _i(name):
    return L.Var(name, L.INDEX)


def _matmul(**kw):
    view = lambda b: L.View(b, L.Const(0, L.INDEX), (L.Const(4, L.INDEX), L.Const(1, L.INDEX)))  # noqa: E731
    bias = L.Load("bias", (_i("j"),), F32)
    epilogue = L.Binary("add", L.Var("acc", F32), bias, F32)
    return L.Matmul(view("out"), view("a"), view("b"), 4, 4, 4, epilogue=epilogue, index=("i", "j"), **kw)


def test_buffers_of_a_matmul_include_its_epilogue_and_workspace():
    m = _matmul(workspace="ws")
    assert buffers_read([m]) == {"a", "b", "bias"}
    assert buffers_written([m]) == {"out", "ws"}
    assert buffers_read([dataclasses.replace(m, accumulate=True)]) == {"a", "b", "bias", "out"}


def test_reduce_loops_are_entered_everywhere():
    """The copies of this walk used to disagree on entering Reduce loops."""
    x = L.Load("x", (_i("i"), _i("r")), F32)
    red = L.Reduce("r", L.Var("size_n", L.INDEX), [L.Accumulator("s", F32, L.Const(0.0, F32))],
                   [L.Let("t", x)], [L.Binary("add", L.Var("s", F32), L.Var("t", F32), F32)])
    store = L.Store("y", (_i("i"),), L.Var("s", F32))
    body = [L.Loop("i", 8, [red, store])]
    assert [type(s).__name__ for s in statements(body)] == ["Loop", "Reduce", "Let", "Store"]
    assert buffers_read(body) == {"x"} and buffers_written(body) == {"y"}
    assert [ld.buffer for ld in loads(body)] == ["x"]
    assert size_params(body) == ["size_n"]


def test_a_shared_subexpression_is_visited_once():
    x = L.Load("x", (_i("i"),), F32)
    e = L.Unary("exp", x, F32)
    for _ in range(60):                      # 2**60 paths: a walk that followed each would hang
        e = L.Binary("add", e, e, F32)
    assert count_exprs(e) == 60 + 3
    doubled = substitute(e, lambda n: L.Load("z", n.index, F32) if isinstance(n, L.Load) else None)
    assert buffers_read(doubled) == {"z"} and count_exprs(doubled) == 60 + 3


def test_substitute_keeps_unchanged_expressions_and_copies_statements():
    x = L.Load("x", (_i("i"),), F32)
    store = L.Store("y", (_i("i"),), x)
    loop = L.Loop("i", 4, [store])
    new = substitute([loop], lambda n: None)
    assert new[0] is not loop and new[0].body[0] is not store      # passes mutate statements
    assert new[0].body[0].value is x and new[0] == loop


def test_rename_buffer_everywhere():
    m = _matmul(workspace="ws")
    body = [L.Loop("i", 4, [L.Store("a", (_i("i"),), L.Load("a", (_i("i"),), F32))]), m]
    renamed = rename_buffer(body, "a", "w")
    assert buffers_read(renamed) == {"w", "b", "bias"} and buffers_written(renamed) == {"w", "out", "ws"}
    assert buffers_read(body) == {"a", "b", "bias"}              # the original is untouched
    assert buffers_written(rename_buffer(body, "ws", "ws2")) == {"a", "out", "ws2"}


def test_children_of_a_reduce_in_evaluation_order():
    init, term = L.Const(0.0, F32), L.Var("t", F32)
    red = L.Reduce("r", 3, [L.Accumulator("s", F32, init)], [L.Let("t", L.Const(1.0, F32))], [term])
    kinds = [type(c).__name__ for c in children(red)]
    assert kinds == ["Accumulator", "Let", "Var"]               # the int extent is no node


def test_fingerprint_names_a_shared_subexpression_once_and_tells_programs_apart():
    x = L.Load("a", (L.Var("i", L.INDEX),), F32)
    for _ in range(60):                     # a DAG whose tree would have 2**60 leaves
        x = L.Binary("add", x, x, F32)
    text = fingerprint([L.Store("out", (L.Var("i", L.INDEX),), x)])
    assert len(text.splitlines()) < 200
    y = L.Binary("mul", x, x, F32)
    assert fingerprint(y) != fingerprint(L.Binary("add", x, x, F32))
    assert fingerprint(L.Const(1.0, F32)) != fingerprint(L.Const(1.0, dt.FLOAT64))


def test_a_reshape_divides_only_the_dims_it_merges_or_splits():
    from tracecomp.lower.loops import index as I
    from tracecomp.lower.loops import ir as L
    i, j, k = (L.Var(n, L.INDEX) for n in "ijk")
    # (2, 3, 4) read as (6, 4): the first two dims merge, the last is untouched
    merged, last = I.reshape((i, j, k), (2, 3, 4), (6, 4))
    assert last is k and "floordiv" not in repr(merged) and "mod" not in repr(merged)
    # (6, 4) read as (2, 3, 4): only the first dim splits
    a, b, c = I.reshape((i, k), (6, 4), (2, 3, 4))
    assert c is k and "floordiv" in repr(a) and "mod" in repr(b)


def test_a_reshape_of_no_elements_reads_element_zero():
    # tile((0, 2)) of a (3, 2) tensor reads (0, 4) as (0, 3, 2, 2): no run of equal sizes
    # pairs (4,) with (3, 2, 2) (an IndexError at b7a4e02); the loop never runs, any index does
    from tracecomp.lower.loops import index as I
    i, j = (L.Var(n, L.INDEX) for n in "ij")
    assert all(isinstance(e, L.Const) and e.value == 0 for e in I.reshape((i, j), (0, 4), (0, 3, 2, 2)))
