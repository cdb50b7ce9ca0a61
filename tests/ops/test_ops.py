"""Every op of ops.yaml against its samples (tests/tables/op_samples.py): eager vs NumPy float64,
traced vs eager, printed-graph round trips and mlir-opt, and the table of user errors."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.printer import print_graph
from tracecomp.ir.verifier import verify
from tracecomp.ops.table import default_table

from tables.op_samples import (EAGER_ONLY, SAMPLES, Sample, all_samples, assert_close, expected_dtypes, leaves,
                        reference_inputs, torch_result_type)

ALL_SAMPLES = all_samples()
DETERMINISTIC = [s for s in ALL_SAMPLES if not s.nondeterministic]
RANDOM = [s for s in ALL_SAMPLES if s.nondeterministic]


def _ids(samples: list[Sample]) -> list[str]:
    counts: dict[str, int] = {}
    out = []
    for s in samples:
        counts[s.op] = counts.get(s.op, 0) + 1
        out.append(f"{s.op}#{counts[s.op]}:{s.desc}")
    return out


def params(samples: list[Sample]):
    return pytest.mark.parametrize("s", samples, ids=_ids(samples))


def run_eager(s: Sample) -> list[np.ndarray]:
    outs = leaves(s.call(*[tc.tensor(a) for a in s.inputs]))
    assert all(isinstance(t, tc.Tensor) for t in outs), f"{s.id}: result is not made of Tensors: {outs!r}"
    return [np.asarray(t) for t in outs]


def run_traced(s: Sample) -> list[np.ndarray]:
    outs = leaves(tc.trace(s.call, backend="interp")(*s.inputs))   # the reference: bit-exact
    assert all(isinstance(t, tc.Tensor) for t in outs), f"{s.id}: traced result is not Tensors: {outs!r}"
    return [np.asarray(t) for t in outs]


# ---------------------------------------------------------------- coverage

def test_every_op_has_samples():
    regions = {name for name, op in default_table().items() if op.kind == "region"}   # tests/control
    missing = sorted(set(default_table()) - set(SAMPLES) - set(EAGER_ONLY) - regions)
    assert not missing, f"ops in ops.yaml without samples in tests/tables/op_samples.py: {missing}"


def test_samples_name_only_table_ops():
    unknown = sorted(set(SAMPLES) - set(default_table()))
    assert not unknown, f"samples name ops that ops.yaml does not declare: {unknown}"
    for name, samples in SAMPLES.items():
        assert all(s.op == name for s in samples)


def test_every_variant_is_sampled():
    """Each op has a sample per variant it declares: a method, operator or property call
    shows up in the samples' descriptions as `x.name(`, the operator symbol or `.prop`."""
    symbols = {"__add__": "+", "__radd__": "+", "__sub__": "-", "__rsub__": "-", "__mul__": "*",
               "__rmul__": "*", "__truediv__": "/", "__rtruediv__": "/", "__pow__": "**", "__rpow__": "**",
               "__matmul__": "@", "__rmatmul__": "@", "__neg__": "-x", "__abs__": "abs(", "__eq__": "==", "__ne__": "!=",
               "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=", "__mod__": "%",
               "__rmod__": "%", "__floordiv__": "//", "__rfloordiv__": "//", "__and__": "&",
               "__rand__": "&", "__or__": "|", "__ror__": "|", "__xor__": "^", "__rxor__": "^",
               "__invert__": "~x"}
    problems = []
    for name, op in default_table().items():
        descs = " | ".join(s.desc for s in SAMPLES.get(name, []) + EAGER_ONLY.get(name, []))
        if "method" in op.variants and f".{op.name}(" not in descs:
            problems.append(f"{name}: no method call sample")
        for dunder in op.operators + op.reflected:
            if symbols[dunder] not in descs:
                problems.append(f"{name}: no sample of {dunder}")
        for prop in op.properties:
            if f".{prop}" not in descs:
                problems.append(f"{name}: no sample of .{prop}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- dtype rules

@pytest.mark.parametrize("operands, expected", [
    ((np.zeros(3, np.int32), 2.5), "float32"),
    ((np.zeros(3, bool), 1), "int64"),
    ((np.zeros(3, np.int32), np.zeros(3, np.int64)), "int64"),
    ((np.zeros(3, np.float32), np.zeros((), np.float64)), "float32"),
    ((np.zeros(3, np.int32), np.zeros((), np.float64)), "float64"),
    ((np.zeros(3, np.int32), np.zeros((), np.int64)), "int32"),
    ((np.zeros((), np.int32), 2.5), "float32"),
    ((np.zeros(3, bool), True), "bool"),
    ((np.zeros(3, np.float64), 2), "float64"),
])
def test_torch_result_type_helper(operands, expected):
    """The samples' independent statement of PyTorch's rules (checked on known answers)."""
    assert torch_result_type(*operands) == expected


@pytest.mark.parametrize("fn, dtype", [
    (lambda: tc.tensor(np.array([1, 2], np.int32)) + 2.5, tc.float32),
    (lambda: tc.tensor([True, False]) + 1, tc.int64),
    (lambda: tc.tensor(np.array([1, 2], np.int32)) / tc.tensor(np.array([2, 2], np.int32)), tc.float32),
    (lambda: tc.tensor([1.0]) < 2, tc.bool),
    (lambda: tc.tensor(np.array([1, 2], np.int32)).sum(), tc.int64),
    (lambda: tc.tensor([True]).sum(), tc.int64),
    (lambda: tc.tensor(np.array([1.0], np.float32)) * tc.tensor(np.float64(2.0)), tc.float32),
    (lambda: tc.tensor(np.array([1], np.int32)).sqrt(), tc.float32),
    (lambda: tc.arange(3), tc.int64),
    (lambda: tc.full((2,), 1.0), tc.float32),
], ids=["int32+2.5", "bool+1", "int/int", "compare", "sum int32", "sum bool", "0-d f64",
        "sqrt int", "arange", "full float"])
def test_promotion_examples(fn, dtype):
    assert fn().dtype is dtype


# ---------------------------------------------------------------- eager vs NumPy

@params(DETERMINISTIC)
def test_eager_matches_numpy(s: Sample):
    got = run_eager(s)
    with np.errstate(all="ignore"):        # edge values: log(0), exp(1e20), ...
        want = s.ref(*reference_inputs(s.inputs))
    want = list(want) if isinstance(want, tuple) else [want]
    dtypes = expected_dtypes(s)
    assert len(got) == len(want) == len(dtypes), f"{s.id}: {len(got)} results, reference {len(want)}"
    for i, (g, w, d) in enumerate(zip(got, want, dtypes)):
        assert str(g.dtype) == d, f"{s.id}: result {i} has dtype {g.dtype}, PyTorch's rules give {d}"
        assert_close(s, g, w, i)


EAGER_SAMPLES = [s for samples in EAGER_ONLY.values() for s in samples]


@params(EAGER_SAMPLES)
def test_eager_only_ops_match_numpy(s: Sample):
    test_eager_matches_numpy(s)


@params(EAGER_SAMPLES)
def test_value_dependent_ops_compile_or_refuse_tracing(s: Sample):
    """Compiled with value-dependent sizes (tests/transforms/test_unbacked_sizes.py), matching
    eager; or, in a form that cannot be (unique over a dim, one_hot's class count), refused."""
    try:
        got = leaves(tc.trace(s.call)(*s.inputs))
    except tc.TraceError as e:
        assert "symbolic" in str(e) or "tc.trace" in str(e), e
        return
    for i, (g, w) in enumerate(zip(got, run_eager(s))):
        assert_close(s, np.asarray(g), w, i)


@params(RANDOM)
def test_random_eager(s: Sample):
    got = run_eager(s)
    assert [g.shape for g in got] == [s.shape]
    assert [str(g.dtype) for g in got] == expected_dtypes(s)
    tc.manual_seed(0)
    a = run_eager(s)
    tc.manual_seed(0)
    b = run_eager(s)
    c = run_eager(s)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0].size < 2 or not np.array_equal(b[0], c[0]), "the generator did not advance"
    if s.op == "rand":
        assert np.all((0 <= a[0]) & (a[0] < 1))


# ---------------------------------------------------------------- traced vs eager

@params(DETERMINISTIC)
def test_traced_equals_eager(s: Sample):
    eager, traced = run_eager(s), run_traced(s)
    assert len(eager) == len(traced)
    for i, (e, t) in enumerate(zip(eager, traced)):
        assert t.dtype == e.dtype and t.shape == e.shape, \
            f"{s.id}: traced result {i} is {t.dtype}{t.shape}, eager {e.dtype}{e.shape}"
        np.testing.assert_array_equal(t, e, err_msg=s.id, strict=True)


@params(RANDOM)
def test_random_traced(s: Sample):
    traced = run_traced(s)
    assert [t.shape for t in traced] == [s.shape]
    assert [str(t.dtype) for t in traced] == expected_dtypes(s)


def test_traced_keeps_the_result_structure():
    """A traced op returns what the eager op returns: a named tuple for (values, indices)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    eager = tc.tensor(x).max(dim=1)
    traced = tc.trace(lambda a: a.max(dim=1))(x)
    assert type(traced) is type(eager)
    np.testing.assert_array_equal(np.asarray(traced.indices), np.asarray(eager.indices))


# ---------------------------------------------------------------- printed graphs

def lowered(s: Sample):
    return tc.trace(s.call).lower(*s.inputs)


@params(ALL_SAMPLES)
def test_printed_graph_round_trip(s: Sample):
    """The traced and the optimized graph verify, and print then parse back to an equal graph."""
    low = lowered(s)
    for stage, graph in (("graph", low.graph), ("optimized", low.optimized)):
        verify(graph)
        text = print_graph(graph)
        assert parse_graph(text) == graph, f"{s.id}: {stage} does not round trip:\n{text}"
    # a composite is recorded as the ops of its program, which name it as their source; one
    # that returns its input or a value known while tracing records no op of its own
    name, composite = f"tc.{s.op}", default_table()[s.op].kind == "composite"
    assert any(op.name == name or op.loc is not None and op.loc.source == name for op in low.graph.ops) \
        or composite and all(op.name == "tc.constant" for op in low.graph.ops) or s.desc.startswith("x[") \
        or s.desc.startswith("0-d x["), f"{s.id}: the graph does not record tc.{s.op}:\n{print_graph(low.graph)}"


_HEADER = re.compile(r'^func\.func @("(?:[^"\\]|\\.)*"|[^(]*)\(')


def _mlir_check(texts: dict[str, str]) -> dict[str, str | None]:
    """mlir-opt's verdict per text, checking many functions per run (bisecting on failure)."""
    keys = list(texts)
    module = "\n".join(_HEADER.sub(f"func.func @f{i}(", texts[k], count=1) for i, k in enumerate(keys))
    try:
        check_with_mlir_opt(module)
        return dict.fromkeys(keys)
    except tc.IRError as e:
        if len(keys) == 1:
            return {keys[0]: str(e)}
    half = len(keys) // 2
    return {**_mlir_check({k: texts[k] for k in keys[:half]}),
            **_mlir_check({k: texts[k] for k in keys[half:]})}


@pytest.fixture(scope="module")
def mlir_verdicts():
    if find_mlir_opt() is None:
        pytest.skip("mlir-opt not found (neither /usr/lib/llvm-22/bin/mlir-opt nor mlir-opt on PATH)")
    texts = {}
    for s, sid in zip(ALL_SAMPLES, _ids(ALL_SAMPLES)):
        try:
            low = lowered(s)
        except Exception:     # test_printed_graph_round_trip reports it
            continue
        texts[sid + "/graph"] = print_graph(low.graph)
        texts[sid + "/optimized"] = print_graph(low.optimized)
    return texts, _mlir_check(texts)


@pytest.mark.parametrize("sid", _ids(ALL_SAMPLES))
def test_mlir_opt_accepts_printed_graphs(sid, mlir_verdicts):
    texts, verdicts = mlir_verdicts
    if sid + "/graph" not in texts:
        pytest.fail(f"{sid}: could not be traced (see test_printed_graph_round_trip)")
    for stage in ("graph", "optimized"):
        err = verdicts[f"{sid}/{stage}"]
        assert err is None, f"{sid} ({stage}):\n{err}\n{texts[f'{sid}/{stage}']}"


# ---------------------------------------------------------------- the errors table

X23 = np.arange(6, dtype=np.float32).reshape(2, 3)
X4 = np.arange(4, dtype=np.float32)
I3 = np.arange(3, dtype=np.int64)
B2 = np.array([True, False])

ValueErr, TypeErr = (tc.ShapeError, ValueError), (tc.ArgumentError, TypeError)
# (description, function of the tensors, inputs, errors it must be, strings the message holds)
ERRORS = [
    ("add shapes", lambda a, b: tc.add(a, b), [X23, X4], ValueErr, ["add", "'self' (2, 3)", "'other' (4,)"]),
    ("+ shapes", lambda a, b: a + b, [X23, X4], ValueErr, ["add", "(2, 3)", "(4,)"]),
    ("where shapes", lambda a, b: tc.where(a > 0, a, b), [X23, X4], ValueErr, ["where", "'other' (4,)", "(2, 3)"]),
    ("clamp shapes", lambda a, b: a.clamp(min=b), [X23, X4], ValueErr, ["clamp", "'min' (4,)", "(2, 3)"]),
    ("matmul inner", lambda a, b: a @ b, [X23, X23], ValueErr, ["matmul", "'self' (2, 3)", "'other' (2, 3)"]),
    ("bitwise on floats", lambda a: a & a, [X23], tc.DTypeError, ["bitwise_and", "float32", "integral"]),
    ("glu odd", lambda a: tc.glu(a), [X23], ValueErr, ["glu", "even", "(2, 3)"]),
    ("leaky_relu ints", lambda a: tc.leaky_relu(a.long()), [X23], tc.DTypeError, ["leaky_relu", "int64"]),
    ("matmul 0-d", lambda a: tc.matmul(a, tc.tensor(1.0)), [X4], ValueErr, ["matmul", "(4,)", "()"]),
    ("matmul dtypes", lambda a: a @ a.double(), [X4], tc.DTypeError, ["matmul", "float32", "float64"]),
    ("mm ranks", lambda a: tc.mm(a, a), [X4], ValueErr, ["mm", "2-D", "(4,)"]),
    ("bmm ranks", lambda a: tc.bmm(a, a), [X23], ValueErr, ["bmm", "3-D", "(2, 3)"]),
    ("sum dim", lambda a: a.sum(dim=2), [X23], ValueErr, ["sum", "'dim'", "2", "(2, 3)"]),
    ("sum dims repeat", lambda a: a.sum(dim=(1, -1)), [X23], ValueErr, ["sum", "'dim'", "(1, -1)"]),
    ("amax dim", lambda a: tc.amax(a, -3), [X23], ValueErr, ["amax", "'dim'", "-3", "(2, 3)"]),
    ("max.dim dim", lambda a: a.max(dim=5), [X23], ValueErr, ["max.dim", "'dim'", "5", "(2, 3)"]),
    ("argmax empty", lambda a: a.argmax(), [np.zeros((0, 2), np.float32)], ValueErr, ["argmax", "(0, 2)"]),
    ("softmax dim", lambda a: a.softmax(2), [X23], ValueErr, ["'dim'", "2", "(2, 3)"]),
    ("logsumexp dim", lambda a: a.logsumexp(-3), [X23], ValueErr, ["'dim'", "-3", "(2, 3)"]),
    ("mean int", lambda a: a.mean(), [I3], tc.DTypeError, ["mean", "int64", "'self'"]),
    ("var int", lambda a: a.var(), [I3], tc.DTypeError, ["var", "int64", "'self'"]),
    ("neg bool", lambda a: -a, [B2], tc.DTypeError, ["neg", "bool"]),
    ("sub bool", lambda a: a - a, [B2], tc.DTypeError, ["sub", "bool"]),
    ("reshape numel", lambda a: a.reshape(4, 2), [X23], ValueErr, ["reshape", "'shape' (4, 2)", "6"]),
    ("reshape two -1", lambda a: a.reshape(-1, -1), [X23], ValueErr, ["reshape", "'shape'", "-1"]),
    ("view numel", lambda a: a.view(5), [X23], ValueErr, ["reshape", "(5,)", "6"]),
    ("permute", lambda a: a.permute(0, 0), [X23], ValueErr, ["permute", "'dims' (0, 0)", "(2, 3)"]),
    ("transpose dim", lambda a: a.transpose(0, 2), [X23], ValueErr, ["transpose", "dim", "2", "2 dims"]),
    ("expand", lambda a: a.expand(3, 3), [X23], ValueErr, ["expand", "(2, 3)", "(3, 3)"]),
    ("squeeze dim", lambda a: a.squeeze(4), [X23], ValueErr, ["squeeze", "'dim'", "4", "(2, 3)"]),
    ("unsqueeze dim", lambda a: a.unsqueeze(3), [X23], ValueErr, ["unsqueeze", "'dim'", "3", "(2, 3)"]),
    ("t 3-D", lambda a: a.t(), [np.zeros((2, 3, 4), np.float32)], ValueErr, ["(2, 3, 4)", "(1, 0)"]),
    ("int scalar too big", lambda a: a + 2**70, [I3], ValueErr, ["add", "'other'", str(2**70), "int64"]),
    ("int scalar overflows int32", lambda a: a * 2**40, [I3.astype(np.int32)], (tc.TracecompError,),
     ["mul", str(2**40)]),
    ("mT 1-D", lambda a: a.mT, [X4], ValueErr, ["dim -2", "1 dims"]),
    ("flatten dims", lambda a: a.flatten(1, 0), [X23], ValueErr, ["flatten", "start_dim", "(2, 3)"]),
    ("cat shapes", lambda a, b: tc.cat([a, b]), [X23, X4], ValueErr, ["cat", "tensors[1]", "(4,)", "(2, 3)"]),
    ("cat 0-d", lambda a: tc.cat([a, a]), [np.array(1.0, np.float32)], ValueErr, ["cat", "tensors[0]", "0-d"]),
    ("add float alpha int", lambda a: a.add(a, alpha=2.5), [I3], tc.DTypeError, ["add", "'alpha'", "int64"]),
    ("sub bool alpha", lambda a: tc.sub(a, a, alpha=True), [X4], tc.DTypeError, ["sub", "'alpha'", "float32"]),
    ("cat empty", lambda: tc.cat([]), [], (tc.TracecompError,), ["cat", "tensors"]),
    ("stack dim", lambda a, b: tc.stack([a, b], 3), [X23, X23], ValueErr, ["'dim'", "3"]),
    ("split sizes", lambda a: a.split([1, 1], dim=1), [X23], ValueErr, ["split.sizes", "(1, 1)", "3"]),
    ("chunk 0", lambda a: a.chunk(0), [X23], ValueErr, ["chunk", "'chunks'", "0"]),
    ("select index", lambda a: a.select(1, 3), [X23], ValueErr, ["select", "index 3", "size 3"]),
    ("getitem index", lambda a: a[2], [X23], ValueErr, ["index 2", "dimension 0", "size 2"]),   # PyTorch's words
    ("getitem too many", lambda a: a[0, 0, 0], [X23], ValueErr, ["too many indices", "2"]),
    ("getitem step", lambda a: a[::0], [X23], ValueErr, ["slice step cannot be zero"]),
    ("getitem tensor bounds", lambda a, i: a[i], [X23, I3], ValueErr, ["index 2 is out of bounds", "size 2"]),
    ("index_select dtype", lambda a: a.index_select(0, a), [X4], tc.DTypeError,
     ["index_select", "'index'", "float32"]),
    ("index_select rank", lambda a, i: a.index_select(0, i.reshape(3, 1)), [X4, I3], ValueErr,
     ["index_select", "'index'", "(3, 1)"]),
    ("gather shape", lambda a, i: a.gather(1, i.reshape(3, 1)), [X23, I3], ValueErr,
     ["gather", "'index'", "(3, 1)", "(2, 3)"]),
    ("layer_norm shape", lambda a: tc.layer_norm(a, (2,)), [X23], ValueErr, ["layer_norm", "(2,)", "(2, 3)"]),
    ("cross_entropy reduction", lambda a, t: tc.cross_entropy(a, t, reduction="avg"),
     [X23, np.array([0, 1], np.int64)], TypeErr, ["reduction", "'avg'"]),
    ("full negative", lambda: tc.full((2, -1), 1.0), [], ValueErr, ["full", "'size' (2, -1)"]),
    ("arange step 0", lambda: tc.arange(0, 5, 0), [], ValueErr, ["arange", "'step'"]),
    ("arange direction", lambda: tc.arange(5, 0, 1), [], ValueErr, ["arange", "start=5", "end=0"]),
    ("rand int", lambda: tc.rand(2, dtype=tc.int32), [], tc.DTypeError, ["rand", "int32"]),
    ("unknown dtype", lambda a: a.to("complex64"), [X4], TypeErr, ["to()", "'dtype'", "ScalarType", "str"]),
    ("unknown dtype object", lambda a: a.to(np.complex64), [X4], TypeErr, ["to()", "'dtype'", "ScalarType"]),
    ("unknown dtype kw", lambda: tc.zeros(2, dtype="complex64"), [], TypeErr, ["zeros()", "'dtype'"]),
    ("wrong type", lambda a: tc.add(a, "1"), [X4], TypeErr, ["add()", "'other'", "str"]),
    ("wrong dim type", lambda a: a.sum(dim=1.5), [X23], TypeErr, ["sum()", "'dim'", "float"]),
    ("wrong list type", lambda a: a.reshape([2, "3"]), [X23], TypeErr, ["reshape()", "'shape'"]),
    ("too many args", lambda a: tc.exp(a, a), [X4], TypeErr, ["exp()", "1 positional", "2 were given"]),
    ("missing arg", lambda a: tc.add(a), [X4], TypeErr, ["add()", "missing", "'other'"]),
    ("unknown kwarg", lambda a: a.sum(keepdims=True), [X4], TypeErr, ["sum()", "unexpected keyword", "keepdims"]),
    ("duplicate kwarg", lambda a: tc.add(a, a, other=a), [X4], TypeErr, ["add()", "multiple values", "'other'"]),
    ("only scalars", lambda: tc.add(2, 3.5), [], TypeErr, ["add", "'self'", "'other'", "3.5"]),
    ("only scalars where", lambda: tc.where(True, 1, 0), [], TypeErr, ["where", "'condition'"]),
    ("no overload", lambda a: tc.max(a, "x"), [X4], TypeErr, ["max()", "max.dim", "max.other", "str"]),
    ("no overload arange", lambda: tc.arange(), [], TypeErr, ["arange()", "arange.start", "'end'"]),
    ("keepdim type", lambda a: a.sum(0, 1), [X23], TypeErr, ["sum()", "'keepdim'", "bool", "int"]),
    ("logcumsumexp int", lambda a: a.logcumsumexp(0), [I3], tc.DTypeError, ["logcumsumexp", "int", "floating"]),
    ("searchsorted sides", lambda a: tc.searchsorted(a, a, right=True, side="left"), [X4], TypeErr,
     ["searchsorted", "side", "right"]),
    ("searchsorted rows", lambda a, b: tc.searchsorted(a, b), [X23, np.zeros((3, 2), np.float32)], ValueErr,
     ["searchsorted", "(2, 3)", "(3, 2)"]),
    # issue 12
    ("batch_norm running_mean size", lambda a: tc.batch_norm(a, tc.zeros(4), tc.ones(3)), [X23], ValueErr,
     ["batch_norm", "running_mean should contain 3 elements not 4", "(2, 3)"]),
    ("batch_norm one value per channel", lambda a: tc.batch_norm(a[:1], None, None, training=True), [X23],
     ValueErr, ["batch_norm", "more than 1 value per channel", "(1, 3)"]),
    ("batch_norm evaluation without stats", lambda a: tc.batch_norm(a, None, None), [X23], TypeErr,
     ["batch_norm", "running_mean", "evaluation"]),
    ("batch_norm one running stat", lambda a: tc.batch_norm(a, tc.zeros(3), None, training=True), [X23], TypeErr,
     ["batch_norm", "both be None or neither"]),
    ("batch_norm 1-D", lambda a: tc.batch_norm(a, None, None, training=True), [X4], ValueErr,
     ["batch_norm", "(N, C, ...)", "(4,)"]),
    ("instance_norm one spatial element", lambda a: tc.instance_norm(a), [X23], ValueErr,
     ["instance_norm", "more than 1 spatial element", "(2, 3)"]),
    ("instance_norm without stats", lambda a: tc.instance_norm(a.unsqueeze(2), use_input_stats=False), [X23],
     TypeErr, ["instance_norm", "running_mean", "use_input_stats"]),
    ("group_norm groups", lambda a: tc.group_norm(a, 2), [X23], ValueErr,
     ["group_norm", "divisible by num_groups", "(2, 3)", "num_groups=2"]),
    ("group_norm weight", lambda a: tc.group_norm(a, 3, tc.ones(2)), [X23], ValueErr,
     ["group_norm", "weight of shape (2,)", "(2, 3)"]),
    ("rms_norm weight shape", lambda a: tc.rms_norm(a, (3,), tc.ones(2)), [X23], ValueErr,
     ["rms_norm", "weight of shape (2,)", "(3,)"]),
    ("rms_norm shape", lambda a: tc.rms_norm(a, (2,)), [X23], ValueErr, ["rms_norm", "(2,)", "(2, 3)"]),
    ("embedding padding_idx", lambda i: tc.embedding(i, tc.ones(3, 2), padding_idx=3), [I3], ValueErr,
     ["embedding", "Padding_idx", "padding_idx 3", "(3, 2)"]),
    ("embedding max_norm", lambda i: tc.embedding(i, tc.ones(3, 2), max_norm=1.0), [I3], TypeErr,
     ["embedding", "max_norm", "not supported"]),
    ("embedding sparse", lambda i: tc.embedding(i, tc.ones(3, 2), sparse=True), [I3], TypeErr,
     ["embedding", "sparse=True", "not supported"]),
    ("embedding float indices", lambda a: tc.embedding(a, tc.ones(3, 2)), [X4], tc.DTypeError,
     ["embedding", "indices", "float32"]),
    ("embedding 1-D weight", lambda i: tc.embedding(i, tc.ones(3)), [I3], ValueErr,
     ["embedding", "'weight' must be 2-D", "(3,)"]),
    ("one_hot int32", lambda i: tc.one_hot(i.int(), 3), [I3], tc.DTypeError, ["one_hot", "int64", "int32"]),
    ("dropout p", lambda a: tc.dropout(a, 1.5), [X4], TypeErr, ["dropout", "between 0 and 1", "1.5"]),
    ("dropout ints", lambda i: tc.dropout(i), [I3], tc.DTypeError, ["dropout", "int64"]),
    # issue 12: sliding windows, attention
    ("conv2d channels", lambda a: tc.conv2d(a.reshape(1, 1, 2, 3), tc.ones(2, 2, 1, 1)), [X23], ValueErr,
     ["conv2d", "(1, 1, 2, 3) has 1 channels", "(2, 2, 1, 1)", "groups=1"]),
    ("conv2d groups", lambda a: tc.conv2d(a.reshape(1, 2, 1, 3), tc.ones(3, 1, 1, 1), groups=2), [X23], ValueErr,
     ["conv2d", "groups=2", "divide by groups"]),
    ("conv2d kernel too large", lambda a: tc.conv2d(a.reshape(1, 1, 2, 3), tc.ones(1, 1, 3, 3)), [X23], ValueErr,
     ["conv2d", "kernel (3, 3)", "(2, 3)"]),
    ("conv2d padding name", lambda a: tc.conv2d(a.reshape(1, 1, 2, 3), tc.ones(1, 1, 1, 1), padding="full"), [X23],
     TypeErr, ["conv2d", "'same', 'valid'", "'full'"]),
    ("conv2d same strided", lambda a: tc.conv2d(a.reshape(1, 1, 2, 3), tc.ones(1, 1, 1, 1), stride=2, padding="same"),
     [X23], TypeErr, ["conv2d", "padding='same'", "stride (2, 2)"]),
    ("conv2d rank", lambda a: tc.conv2d(a, tc.ones(1, 1, 1, 1)), [X23], ValueErr, ["conv2d", "3-D", "4-D", "(2, 3)"]),
    ("conv2d bias", lambda a: tc.conv2d(a.reshape(1, 1, 2, 3), tc.ones(2, 1, 1, 1), tc.ones(3)), [X23], ValueErr,
     ["conv2d", "bias", "(2,)", "(3,)"]),
    ("conv_transpose2d output_padding", lambda a: tc.conv_transpose2d(a.reshape(1, 1, 2, 3), tc.ones(1, 1, 2, 2),
     stride=2, output_padding=2), [X23], TypeErr, ["conv_transpose2d", "output_padding (2, 2)", "stride (2, 2)"]),
    ("max_pool2d padding", lambda a: tc.max_pool2d(a.reshape(1, 1, 2, 3), 2, padding=2), [X23], TypeErr,
     ["max_pool2d", "padding (2, 2)", "half of the kernel (2, 2)"]),
    ("im2col rank", lambda a: tc.im2col(a, 1), [X23], ValueErr, ["im2col", "3-D or 4-D", "(2, 3)"]),
    ("col2im windows", lambda a: tc.col2im(a, (3, 3), 1), [X23], ValueErr, ["col2im", "last dim (3)", "3 * 3"]),
    ("attention feature sizes", lambda a: tc.scaled_dot_product_attention(a, a.T, a), [X23], ValueErr,
     ["scaled_dot_product_attention", "query (2, 3), key (3, 2)"]),
    ("attention mask and causal", lambda a: tc.scaled_dot_product_attention(a, a, a, tc.ones(2, 2), is_causal=True),
     [X23], TypeErr, ["scaled_dot_product_attention", "not both"]),
    # issue 12: padding, resizing, adaptive pooling
    ("constant_pad_nd odd", lambda a: tc.constant_pad_nd(a, (1, 2, 3)), [X23], ValueErr,
     ["constant_pad_nd", "'pad' (1, 2, 3)", "odd"]),
    ("constant_pad_nd too many", lambda a: tc.constant_pad_nd(a, (1, 1) * 3), [X23], ValueErr,
     ["constant_pad_nd", "3 dims", "(2, 3)"]),
    ("constant_pad_nd negative size", lambda a: tc.constant_pad_nd(a, (-2, -2)), [X23], ValueErr,
     ["constant_pad_nd", "(-2, -2)", "size 3", "-1"]),
    ("pad mode", lambda a: tc.pad(a, (1, 1), mode="mirror"), [X23], TypeErr, ["pad", "'mirror'", "reflect"]),
    ("pad reflect too far", lambda a: tc.pad(a, (3, 0), "reflect"), [X23], ValueErr,
     ["pad", "'reflect'", "(3, 0)", "(2, 3)", "less than the size 3"]),
    ("pad circular too far", lambda a: tc.pad(a, (0, 4), "circular"), [X23], ValueErr,
     ["pad", "'circular'", "(0, 4)", "(2, 3)", "at most"]),
    ("pad replicate rank", lambda a: tc.pad(a, (1, 1, 1, 1), "replicate"), [X23], ValueErr,
     ["pad", "'replicate'", "(1, 1, 1, 1)", "(2, 3)", "3-D or 4-D"]),
    ("pad value with reflect", lambda a: tc.pad(a, (1, 1), "reflect", 2.0), [X23], TypeErr,
     ["pad", "'reflect'", "value 2.0", "'constant'"]),
    ("interpolate neither size", lambda a: tc.interpolate(a.reshape(1, 2, 3)), [X23], TypeErr,
     ["interpolate", "size", "scale_factor", "neither"]),
    ("interpolate both sizes", lambda a: tc.interpolate(a.reshape(1, 2, 3), 4, 2.0), [X23], TypeErr,
     ["interpolate", "size", "scale_factor", "both"]),
    ("interpolate bicubic", lambda a: tc.interpolate(a.reshape(1, 1, 2, 3), 4, mode="bicubic"), [X23], TypeErr,
     ["interpolate", "'bicubic'", "not supported", "(1, 1, 2, 3)"]),
    ("interpolate antialias", lambda a: tc.interpolate(a.reshape(1, 1, 2, 3), 4, mode="bilinear", antialias=True),
     [X23], TypeErr, ["interpolate", "antialias", "not supported"]),
    ("interpolate bilinear rank", lambda a: tc.interpolate(a.reshape(1, 2, 3), 4, mode="bilinear"), [X23], ValueErr,
     ["interpolate", "'bilinear'", "4-D", "(1, 2, 3)"]),
    ("interpolate nearest align_corners", lambda a: tc.interpolate(a.reshape(1, 2, 3), 4, align_corners=True),
     [X23], TypeErr, ["interpolate", "align_corners", "'nearest'"]),
    ("interpolate size length", lambda a: tc.interpolate(a.reshape(1, 1, 2, 3), (2, 3, 4)), [X23], ValueErr,
     ["interpolate", "(2, 3, 4)", "(1, 1, 2, 3)"]),
    ("interpolate linear int", lambda a: tc.interpolate(a.reshape(1, 2, 3).long(), 4, mode="linear"), [X23],
     tc.DTypeError, ["interpolate", "'linear'", "int64"]),
    ("adaptive_avg_pool2d rank", lambda a: tc.adaptive_avg_pool2d(a, 2), [X4], ValueErr,
     ["adaptive_avg_pool2d", "3-D or 4-D", "(4,)"]),
    ("adaptive_avg_pool2d empty", lambda a: tc.adaptive_avg_pool2d(a, 2), [np.zeros((2, 0, 3), np.float32)],
     ValueErr, ["adaptive_avg_pool2d", "non-empty", "(2, 0, 3)"]),
    ("adaptive_max_pool2d int", lambda a: tc.adaptive_max_pool2d(a, 1), [I3.reshape(1, 1, 3)], tc.DTypeError,
     ["adaptive_max_pool2d", "int64"]),
    ("adaptive_max_pool1d size", lambda a: tc.adaptive_max_pool1d(a, -1), [X23], ValueErr,
     ["adaptive_max_pool1d", "(-1,)"]),
]
RUNTIME_ERRORS = [   # found only when the values are seen (eagerly, or when the traced graph runs)
    ("index_select bounds", lambda a, i: a.index_select(0, i), [X4, np.array([0, 4], np.int64)], ValueErr,
     ["index_select", "index 4", "size 4"]),
    ("gather bounds", lambda a, i: a.gather(1, i), [X23, np.array([[3], [0]], np.int64)], ValueErr,
     ["gather", "index 3", "size 3"]),
    ("pow negative int", lambda a: a ** -1, [I3], ValueErr, ["pow", "negative"]),
    ("index_select negative", lambda a, i: a.index_select(0, i), [X4, np.array([0, -1], np.int64)], ValueErr,
     ["index_select", "index -1", "size 4"]),
    ("gather negative", lambda a, i: a.gather(0, i), [X4, np.array([-4], np.int64)], ValueErr,
     ["gather", "index -4", "size 4"]),
    # negative indices count from the end, so the compiled check allows [-size, size)
    ("take bounds", lambda a, i: tc.take(a, i), [X4, np.array([-4, 4], np.int64)], ValueErr, ["index 4", "size 4"]),
    ("take negative", lambda a, i: tc.take(a, i), [X4, np.array([-5, 3], np.int64)], ValueErr, ["out of bounds", "size 4"]),
    ("take_along_dim bounds", lambda a, i: tc.take_along_dim(a, i, 1), [X23, np.array([[3], [-1]], np.int64)],
     ValueErr, ["index 3", "size 3"]),
    # eagerly PyTorch's "Class values must be ...", compiled the scatter's index check
    ("one_hot too large", lambda i: tc.one_hot(i, 2), [I3], ValueErr, ["one_hot", "2"]),
    ("one_hot negative", lambda i: tc.one_hot(i, 3), [np.array([0, -1])], ValueErr, ["one_hot", "-1"]),
    ("embedding bounds", lambda i: tc.embedding(i, tc.ones(3, 2)), [np.array([0, 3])], ValueErr,
     ["embedding", "index 3", "size 3"]),
]
_THIS_FILE = os.path.basename(__file__)


def _check_error(exc_info, fn, errors, needles, mode):
    err = exc_info.value
    assert isinstance(err, tc.TracecompError), f"{mode}: {type(err).__name__} is not a TracecompError"
    assert isinstance(err, errors), f"{mode}: {type(err).__name__} is not one of {errors}"
    msg = str(err)
    for needle in needles:
        assert needle in msg, f"{mode}: message lacks {needle!r}:\n{msg}"
    where = f"{_THIS_FILE}:{fn.__code__.co_firstlineno}"
    assert where in msg, f"{mode}: message lacks the user's line {where}:\n{msg}"


@pytest.mark.parametrize("desc, fn, inputs, errors, needles", ERRORS + RUNTIME_ERRORS,
                         ids=[e[0] for e in ERRORS + RUNTIME_ERRORS])
def test_errors(desc, fn, inputs, errors, needles):
    """Eagerly, and traced (compiled: found at trace time, or when the inputs are checked)."""
    with pytest.raises(Exception) as info:
        fn(*[tc.tensor(a) for a in inputs])
    _check_error(info, fn, errors, needles, "eager")
    with pytest.raises(Exception) as info:
        tc.trace(fn)(*inputs)
    _check_error(info, fn, errors, needles, "traced")


# Errors raised inside a composite's decomposition should name the op the user called.
COMPOSITE_ERRORS = [
    ("softmax", lambda a: a.softmax(2), [X23], ValueErr, ["softmax", "'dim'", "(2, 3)"]),
    ("log_softmax", lambda a: tc.log_softmax(a, -3), [X23], ValueErr, ["log_softmax", "'dim'", "(2, 3)"]),
    ("logsumexp", lambda a: a.logsumexp(2), [X23], ValueErr, ["logsumexp", "'dim'", "(2, 3)"]),
    ("view", lambda a: a.view(5), [X23], ValueErr, ["view", "'size' (5,)", "(2, 3)"]),
    ("stack", lambda a, b: tc.stack([a, b]), [X23, X4], ValueErr, ["stack", "tensors[1]", "(4,)", "(2, 3)"]),
    ("mT", lambda a: a.mT, [X4], ValueErr, ["mT", "(4,)"]),
    ("t", lambda a: a.t(), [np.zeros((2, 3, 4), np.float32)], ValueErr, ["t()", "(2, 3, 4)"]),
    ("cross_entropy", lambda a, t: tc.cross_entropy(a, t, reduction="avg"), [X23, np.array([0, 1], np.int64)],
     TypeErr, ["cross_entropy", "'reduction'", "'avg'"]),
    ("linear", lambda a, w: tc.linear(a, w), [X23, np.zeros((4, 2), np.float32)], ValueErr,
     ["linear", "'weight' (4, 2)", "(2, 3)"]),
    ("topk", lambda a: a.topk(5), [X4], ValueErr, ["topk", "k = 5", "[0, 4]"]),
    ("matrix_norm 2", lambda a: tc.linalg.matrix_norm(a, 2), [X23], TypeErr, ["linalg.matrix_norm", "ord 2", "singular"]),
    ("vector_norm int", lambda a: tc.linalg.vector_norm(a), [I3], tc.DTypeError, ["linalg.vector_norm", "int64"]),
    ("einsum operands", lambda a: tc.einsum("ij,jk", a), [X23], ValueErr, ["einsum", "2 operand subscripts", "1"]),
    ("einsum sizes", lambda a, b: tc.einsum("ij,jk", a, b), [X23, X23], ValueErr, ["einsum", "'j'", "3", "2"]),
    ("tensordot sizes", lambda a, b: tc.tensordot(a, b, [1], [0]), [X23, X23], ValueErr, ["tensordot", "(2, 3)"]),
    ("cdist shapes", lambda a, b: tc.cdist(a, b), [X23, X4], ValueErr, ["cdist", "(2, 3)", "(4,)"]),
    ("kthvalue", lambda a: tc.kthvalue(a, 0), [X4], ValueErr, ["kthvalue", "k = 0", "[1, 4]"]),
]


@pytest.mark.parametrize("desc, fn, inputs, errors, needles", COMPOSITE_ERRORS, ids=[e[0] for e in COMPOSITE_ERRORS])
def test_composite_errors_name_the_called_op(desc, fn, inputs, errors, needles):
    with pytest.raises(Exception) as info:
        fn(*[tc.tensor(a) for a in inputs])
    _check_error(info, fn, errors, needles, "eager")


@pytest.mark.parametrize("name", ["complex64", "int8", "uint8"])
def test_unsupported_dtype_is_refused(name):
    with pytest.raises(tc.TracecompError, match=name):
        tc.tensor(X4).to(name)
