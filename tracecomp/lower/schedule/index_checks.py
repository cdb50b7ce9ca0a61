"""Which indices a program checks, where, and the error a failed check raises.

Every gather, index_select, scatter, index_add (and so every indexing and item assignment,
which decompose into them) reads or writes at positions that are data.  Eager execution
raises for a position outside the dim; compiled code must too, not clamp silently:
- an index that is a function input (through views, integer casts, the negative-index wrap
  `where(t < 0, t + size, t)` and nll_loss's ignore_index) is checked by the runtime before
  the kernels run: `Scheduler._mark_index_inputs` records an IndexCheck per input buffer;
- every other index is computed inside the program and checked where a kernel uses it:
  `IndexChecks.index` wraps it in a loop-IR CheckedIndex (loops/ir.py), numbered in the
  order the scheduler meets them, one number per (op, dim), recording into the program's
  error buffer INDEX_ERRORS.  It is skipped where the index's range is known to lie inside
  the dim (`static_range`: constants, aranges, sort positions, arithmetic of those) or
  where the index is an input checked as above.
After the kernels the caller reads the error record: `recorded_error` is the ShapeError of
the lowest-numbered failed check, naming the op, the offending index (the largest one seen
as an unsigned number: a negative index beats a positive one; before the graph's wrap of
negative indices, as the user computed it), the dim, its size and the user's line: the
message check_indices gives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...core import dtypes as dt
from ...core.errors import ShapeError, add_location
from ...ir import CONSTANT, Op, Value
from ...ops import rules
from ...ops.table import VIEW_KINDS
from ...core.symbolic import is_dynamic
from ..loops import index as I
from ..loops import ir as L

MAX_DEPTH = 12          # graph ops static_range looks through


@dataclass(frozen=True)
class IndexCheck:
    """An index into dim `dim` (of size `size`) of op `op`, at the user's line `loc`.  For a
    function input (checked before the kernels run, so a bad index raises instead of
    reading out of bounds): `allowed` is one more value the graph maps away first (an
    ignore_index), and `wraps` says negative values count from the end ([-size, size))."""
    op: str
    dim: int
    size: object
    loc: object = None
    allowed: Optional[int] = None
    wraps: bool = False

    def error(self, value: int) -> ShapeError:
        """The error eager execution raises for `value`, located at the user's line."""
        err = ShapeError(f"{self.op}: index {value} is out of bounds for dim {self.dim} with size {self.size}")
        return add_location(err, str(self.loc) if self.loc else None)


def recorded_error(checks: list[IndexCheck], record: np.ndarray) -> Optional[ShapeError]:
    """The error of the lowest-numbered failed check in an error record (loops/ir.py's
    layout), or None when none failed."""
    if not record[0]:
        return None
    for c, check in enumerate(checks):
        if record[1 + 2 * c]:
            return check.error(user_value(check, int(np.int64(record[2 + 2 * c]))))
    return ShapeError("an index check failed, but the error record names no check (a bug in tracecomp)")


def user_value(check: IndexCheck, recorded: int) -> int:
    """The index the user's code computed, from the one a failed check recorded: where the
    graph wraps negative indices (`wraps`), a recorded t + size < 0 came from t."""
    return recorded - check.size if check.wraps and recorded < 0 and isinstance(check.size, int) else recorded


class IndexChecks:
    """The computed-index checks of one scheduling (see the module docstring).  `enabled`
    False (tc.trace(..., check_indices=False)) clamps every index unchecked."""

    def __init__(self, sched, enabled: bool = True):
        self.sched = sched
        self.enabled = enabled
        self.checks: list[IndexCheck] = []
        self._numbers: dict[tuple[int, int], int] = {}

    def index(self, op: Op, dim: int, index_value: Value, raw: L.Expr, size) -> L.Expr:
        """The position that `op` reads or writes along `dim` (of `size`), given `raw`, the
        loop-IR value of its index operand `index_value`: a CheckedIndex, or, where the
        index is known to be in range or checks are off, `raw` clamped into range."""
        if not self.enabled or self.known_inside(index_value, size):
            wrapped = L.Select(L.Binary("lt", raw, I.ic(0), dt.BOOL), I.add(raw, size), raw, L.INDEX)
            return I.clamp(wrapped, 0, size - 1)
        return L.CheckedIndex(raw, I.dim(size), self._error_buffer(), self._number(op, dim, index_value, size))

    def _number(self, op: Op, dim: int, index_value: Value, size) -> int:
        key = (id(op), dim)
        if key not in self._numbers:
            wraps = self.sched.wrapped_index(index_value, size)
            self._numbers[key] = len(self.checks)
            self.checks.append(IndexCheck(self.sched.table[op.name].full_name, dim, size, op.loc, wraps=wraps))
        return self._numbers[key]

    def _error_buffer(self) -> str:
        """The program's error record (loops/ir.py), made on first use; its length is set
        when scheduling ends (`finish`)."""
        buffers = self.sched.buffers
        if L.INDEX_ERRORS not in buffers:
            buffers[L.INDEX_ERRORS] = L.Buffer(L.INDEX_ERRORS, dt.INT64, (L.error_slots(0),), "errors")
        return L.INDEX_ERRORS

    def finish(self, program) -> None:
        """Give the program its checks and the error record one (failed, value) pair per
        check, in the program's buffers and in every kernel that records into it."""
        program.computed_checks = list(self.checks)
        if L.INDEX_ERRORS not in self.sched.buffers:
            return
        record = L.Buffer(L.INDEX_ERRORS, dt.INT64, (L.error_slots(len(self.checks)),), "errors")
        self.sched.buffers[L.INDEX_ERRORS] = record
        program.index_errors = L.INDEX_ERRORS
        for k in program.kernels:
            k.buffers = [record if b.name == L.INDEX_ERRORS else b for b in k.buffers]

    def known_inside(self, v: Value, size) -> bool:
        """Whether every value of `v` lies in [0, size): an input the runtime checks, or a
        static range inside it."""
        if self.sched.checked_input(v, size) is not None:
            return True
        if is_dynamic(size):
            return False
        bounds = static_range(v, self.sched.names)
        return bounds is not None and 0 <= bounds[0] and bounds[1] < size


def static_range(v: Value, materialized: dict, depth: int = 0) -> Optional[tuple[int, int]]:
    """(lo, hi) with lo <= every element of the integer value `v` <= hi, where the graph
    tells: constants, full, arange, sort and arg-reduction positions, and views, integer
    casts, gathers, add/sub/mul/minimum/maximum/where of such values.  None if unknown
    (function inputs, values read from memory the program computed, anything else)."""
    op = v.op
    if op is None or depth > MAX_DEPTH or not _is_integral(v.type.dtype) or 0 in _static_shape(v):
        return None
    if op.name == CONSTANT:
        value = np.asarray(op.attrs["value"])
        return (int(value.min()), int(value.max())) if value.size and value.dtype.kind in "iub" else None
    from ...ops.table import by_ir_name
    opdef = by_ir_name()[op.name]
    args = opdef.arguments_from(op.operands, op.attrs)
    kind, name = opdef.kind, opdef.full_name

    def of(x) -> Optional[tuple[int, int]]:
        if isinstance(x, (bool, int, np.integer)):
            return int(x), int(x)
        return static_range(x, materialized, depth + 1) if isinstance(x, Value) else None

    if kind in VIEW_KINDS or kind == "cast" or kind in ("gather", "index_select"):
        return of(op.operands[0])
    if kind == "full":
        return of(args["fill_value"])
    if kind == "arange":
        return _arange_range(args, v)
    if kind in ("sort", "arg_reduction") and v.type.dtype == dt.INT64 and v is op.results[-1]:
        return _position_range(opdef, args, op.operands[0])
    return _arithmetic_range(name, args, of)


def _arithmetic_range(name: str, args: dict, of) -> Optional[tuple[int, int]]:
    """Interval arithmetic for the elementwise ops index computations use."""
    if name == "where.self":
        a, b = of(args["self"]), of(args["other"])
        taken = _known_condition(args["condition"], of)
        if taken is not None:              # the wrap where(t < 0, t + n, t) of a t >= 0
            return a if taken else b
        return (min(a[0], b[0]), max(a[1], b[1])) if a and b else None
    if name not in ("add", "sub", "mul", "minimum", "maximum"):
        return None
    a, b = of(args["self"]), of(args["other"])
    if a is None or b is None:
        return None
    if name in ("add", "sub"):
        alpha = args.get("alpha", 1)
        if not isinstance(alpha, int):
            return None
        b = sorted((b[0] * alpha, b[1] * alpha))
        return (a[0] + b[0], a[1] + b[1]) if name == "add" else (a[0] - b[1], a[1] - b[0])
    if name == "mul":
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    pick = min if name == "minimum" else max
    return pick(a[0], b[0]), pick(a[1], b[1])


def _known_condition(cond, of) -> Optional[bool]:
    """The value of a condition `t < c` (or `t >= c`) that t's range decides everywhere; else None."""
    op = getattr(cond, "op", None)
    if op is None or op.name not in ("tc.lt", "tc.ge") or len(op.operands) != 1:
        return None
    t, c = of(op.operands[0]), op.attrs.get("other")
    if t is None or not isinstance(c, int):
        return None
    below = True if t[1] < c else False if t[0] >= c else None
    return below if below is None or op.name == "tc.lt" else not below


def _arange_range(args: dict, v: Value) -> Optional[tuple[int, int]]:
    start, _, step = rules.arange_bounds(args, v.type.dtype)
    n = v.type.shape[0]
    if not all(isinstance(x, int) for x in (start, step, n)):
        return None
    last = start + (n - 1) * step
    return min(start, last), max(start, last)


def _position_range(opdef, args: dict, x: Value) -> Optional[tuple[int, int]]:
    """Positions along the dim an argsort or argmax walks: [0, n - 1]."""
    shape = x.type.shape
    dim = args.get("dim")
    n = int(np.prod(shape, dtype=np.int64)) if dim is None else (shape[dim % len(shape)] if shape else 1)
    return (0, n - 1) if isinstance(n, (int, np.integer)) and n > 0 else None


def _is_integral(dtype) -> bool:
    return dtype == dt.BOOL or not dtype.is_floating_point


def _static_shape(v: Value) -> tuple:
    return tuple(d if isinstance(d, int) else -1 for d in v.type.shape)
