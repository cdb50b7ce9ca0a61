"""Value-dependent sizes (PyTorch's unbacked sizes): nonzero, x[mask], masked_select, unique,
repeat_interleave and tensor_split with tensor arguments under tc.trace.

Design.  Each such op is split into a *host step* that computes int64 index arrays (or
unique's values) from its operands' values, and ordinary traced ops that use them
(index_select, gather, take: they have gradients, so x[mask] differentiates as in eager).
Under tc.trace the host step is not recorded as an op: its results become new graph inputs
whose shapes hold fresh size symbols (`nonzero_0`, symbolic.Dim), and the step is kept as a
`HostStep` beside the graph.  tc.trace then runs the graph in stages
(transforms/staging.py): the ops that compute a step's operands, compiled as a program of
their own; the step itself on the host (NumPy, as eagerly: it reads the count); then the
whole graph as one dynamic program (runtime/compiled.py DynamicProgram) whose size
parameters the step's results carry in their shapes.  So every later op is compiled once,
for every count, by the symbolic-size machinery that tc.trace(dynamic=...) already has.

Why this split and not a count kernel inside the entry point: the entry point allocates
its temporaries for sizes known on entry (its workspace plan), and every size parameter
is already read from an input's shape (entry_sizes.ShapeEquations), so making the host
step's results inputs needs no change to the scheduler or the code generators.  The cost
is that the final program recomputes the operands' producers (a cheap mask, usually a
graph input that needs no program at all).

Where no top-level tc.trace can stage the step (inside tc.scan/cond/while bodies, vmap,
export, or a trace for another device) it raises a TraceError naming the op and the line.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.errors import TraceError, add_location
from ..core.locations import user_location
from ..core.symbolic import Dim, hint as size_hint
from ..core.types import TensorType
from ..dispatch import api as tc
from ..dispatch.tracer import current
from ..ir import Value


@dataclass(eq=False)
class HostStep:
    """One value-dependent step of a traced graph: `fn` maps the operands' arrays to the
    results' arrays (graph inputs, whose shapes hold the step's fresh sizes)."""
    name: str
    fn: Callable[..., list]
    operands: list[Value]
    results: list[Value]
    where: str
    key: tuple


FRESH = "count"     # a result dim that is the step's count, in `shapes` below

_ROWS_HINT = "for a static shape use tc.nonzero_static(x, size=...), or keep x's shape with tc.where"
_MASK_HINT = "for a static shape keep {}'s shape: tc.where(mask, x, 0) or x.masked_fill(~mask, 0)"
_STATIC_HINTS = {
    "nonzero": _ROWS_HINT, "argwhere": _ROWS_HINT,
    "masked_select": _MASK_HINT.format("self"), "x[mask]": _MASK_HINT.format("x"),
    "unique": "tc.trace compiles unique over all elements (dim=None) only",
    "one_hot": "pass num_classes to fix the number of classes",
    "repeat_interleave": "pass output_size to fix the result's size",
    "tensor_split": "pass the split points as a list of ints",
}
_WHERE = ("tc.trace compiles such sizes only at the top level of a function traced for the CPU, "
          "not inside a loop or branch body, tc.vmap or tc.export")


def values_for(name: str, x, where: str = "") -> np.ndarray:
    """x's values, which `name`'s result shape depends on: inside tc.trace (where no host
    step can stage them), a TraceError at the user's line that says how to keep the shape
    static."""
    what = name if name.startswith("x[") else f"tc.{name}"
    return x._concrete(f"{what} (its result's shape depends on the values{where}; {_STATIC_HINTS[name]})")


def host_step(name: str, fn: Callable[..., list], inputs: list, shapes: list[tuple], dtypes: list,
              hint: int, key: tuple):
    """fn(*arrays of inputs) as tensors: eagerly run at once; under tc.trace recorded as a
    HostStep whose results are new graph inputs of `shapes` and `dtypes`, where a str dim is
    a new size (equal strs: one size), planned for `hint` by the scheduler's heuristics.
    A step with the same `key` (what fn computes, besides its inputs) on the same traced
    values is recorded once: `x[m]` twice has one size, as eager's two results do."""
    if all(t._data is not None and t._batch is None for t in inputs):
        arrays = fn(*[t._concrete(name) for t in inputs])      # (from GPU memory too)
        return [tc.tensor(a) for a in arrays]
    ctx = current()
    steps = getattr(ctx, "host_steps", None)
    if steps is None or any(t._batch is not None for t in inputs):
        for t in inputs:                   # the error of reading a value here (TraceError, VmapError)
            values_for(name, t, f": {_WHERE}")
        raise AssertionError("unreachable: a traced input's values were read")
    operands = [ctx.value_of(t) for t in inputs]
    same = next((st for st in steps if st.key == key and st.operands == operands), None)
    if same is not None:
        return [ctx.wrap(v) for v in same.results]
    fresh: dict[str, Dim] = {}
    for d in (d for shape in shapes for d in shape if isinstance(d, str)):
        if d not in fresh:
            fresh[d] = Dim.named(f"{_identifier(name)}_{next(ctx.size_counter)}", max(hint, 2))
    results = [ctx.graph.add_input(TensorType(tuple(fresh.get(d, d) if isinstance(d, str) else d
                                                    for d in shape), dtype))
               for shape, dtype in zip(shapes, dtypes)]
    steps.append(HostStep(name, fn, operands, results, str(user_location()), key))
    return [ctx.wrap(v) for v in results]


def enable(ctx) -> None:
    """Let the trace `ctx` stage value-dependent steps (tc.trace's top-level CPU traces)."""
    ctx.host_steps = []
    ctx.size_counter = itertools.count()


def refuse(name: str, why: str) -> TraceError:
    """The TraceError for a value-dependent form that cannot be staged, at the user's line."""
    return add_location(TraceError(f"{name} under tc.trace: {why}"), str(user_location()))


def _identifier(name: str) -> str:
    return "mask" if name.startswith("x[") else name


# ------------------------------------------------------------------ the ops' host steps
def nonzero_rows(name: str, x):
    """nonzero's rows: int64 (count, x.ndim), a graph input of the step (a compiled stack
    would be a temporary that cat's clamped reads could see unwritten at count 0)."""
    def rows(a):
        return [np.argwhere(a).astype(np.int64)]
    return host_step(name, rows, [x], [(FRESH, x.ndim)], [tc.int64], _numel(x.shape), ("rows",))[0]


def mask_columns(name: str, x) -> list:
    """nonzero's columns, one int64 (count,) tensor per dim of x (x[mask]'s indices).  Traced,
    from the flat positions (NumPy's flatnonzero is ~20x faster than argwhere), split into
    coordinates by compiled code."""
    if x._data is not None and x._batch is None:
        return [tc.tensor(c.astype(np.int64)) for c in np.nonzero(x._concrete(name))]
    if x.ndim == 0 or not all(isinstance(d, int) for d in x.shape):
        rows = nonzero_rows(name, x)
        return [tc.select(rows, 1, k) for k in range(x.ndim)]
    flat = _positions(name, x, tuple(x.shape))
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(x.ndim)]
    return [tc.remainder(tc.floor_divide(flat, s), n) for s, n in zip(strides, x.shape)]


def masked_positions(mask, shape):
    """The flat positions where `mask` broadcast to `shape` is True: int64 (count,)."""
    return _positions("masked_select", mask, tuple(shape))


def _positions(name: str, mask, shape: tuple):
    def positions(m):
        return [np.flatnonzero(np.broadcast_to(m, shape)).astype(np.int64)]
    return host_step(name, positions, [mask], [(FRESH,)], [tc.int64], _numel(shape), ("positions", shape))[0]


def unique_values(x, return_inverse: bool, return_counts: bool):
    """torch.unique(sorted) of all elements: values (count,), inverse (x's shape), counts (count,)."""
    def run(a):
        found, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
        return [found, inverse.reshape(a.shape).astype(np.int64), counts.astype(np.int64)]
    shapes, dtypes = [(FRESH,), tuple(x.shape), (FRESH,)], [x.dtype, tc.int64, tc.int64]
    found, inverse, counts = host_step("unique", run, [x], shapes, dtypes, _numel(x.shape), ("unique",))
    out = [found] + ([inverse] if return_inverse else []) + ([counts] if return_counts else [])
    return out[0] if len(out) == 1 else tuple(out)


def repeated_positions(n: int, repeats, output_size, check: Callable):
    """repeat_interleave's source positions along its dim: int64 (total,), `check(counts)`
    refusing bad repeats (as eagerly); output_size, when given, is the static total."""
    def run(r):
        counts = check(r.tolist())
        return [np.repeat(np.arange(n, dtype=np.int64), counts)]
    total = FRESH if output_size is None else output_size
    return host_step("repeat_interleave", run, [repeats], [(total,)], [tc.int64], n,
                     ("repeat", n, output_size))[0]


def split_ranges(n: int, points, bounds: Callable):
    """tensor_split at a 1-D tensor of points: for each piece the int64 positions it takes
    along the dim (bounds(list of ints) gives the pieces' (start, end))."""
    if points.ndim != 1:
        raise refuse("tensor_split", "a 0-d tensor of sections makes the number of pieces depend "
                                     "on its value; pass the count as a Python int")
    pieces = points.shape[0] + 1
    if not isinstance(pieces, int):
        raise refuse("tensor_split", f"the number of pieces {pieces} must be static")

    def run(p):
        return [np.arange(a, b, dtype=np.int64) for a, b in bounds(p.tolist())]
    return host_step("tensor_split", run, [points], [(f"piece{k}",) for k in range(pieces)],
                     [tc.int64] * pieces, n, ("split", n))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= size_hint(d)
    return n
