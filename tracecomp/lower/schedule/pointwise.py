"""The expression of a value at an index: how ops that need no loop of their own inline.

`Inliner.value_at(v, index)` is a Load when `v` lives in a buffer (function inputs,
materialized values, large constants) and otherwise the expression of its producer:
elementwise ops evaluate their table formula on the loop-IR builders (exprs.py), view ops
remap the index (loops/index.py), gather/index_select load their index tensor, cat selects
between its inputs.  Indirect indices are checked and clamped into range (`indirect`,
schedule/index_checks.py), so no index read from data touches memory outside a buffer,
and one out of range raises as it does eagerly.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...core import dtypes as dt
from ...core.errors import BackendError
from ...core.symbolic import is_dynamic, provably
from ...ir import CONSTANT, Op, Value
from ...ops import elementwise, rules
from ...ops.table import VIEW_KINDS, OpDef, by_ir_name   # VIEW_KINDS: re-exported for the scheduler
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import PRIMITIVES, X, cast, const, lift


class Inliner:
    def __init__(self, buffers: dict[Value, str], indices=None):
        self.buffers = buffers            # values that live in memory, by buffer name
        self.indices = indices            # index_checks.IndexChecks: None clamps unchecked
        self.table = by_ir_name()

    def value_at(self, v: Value, index: I.Index) -> L.Expr:
        if v in self.buffers:
            return L.Load(self.buffers[v], tuple(index), v.type.dtype)
        op = v.op
        if op is None:
            raise BackendError(f"value {v} has no buffer and no producer")
        if op.name == CONSTANT:
            return _scalar_constant(op.attrs["value"], v.type.dtype)
        return self.op_at(op, v.index, index)

    def op_at(self, op: Op, result: int, index: I.Index) -> L.Expr:
        opdef = self.table[op.name]
        args = opdef.arguments_from(op.operands, op.attrs)
        out = op.results[result].type
        kind = opdef.kind
        if kind == "elementwise":
            return self._elementwise(opdef, args, out, index)
        if kind == "cast":
            return cast(self.value_at(args["self"], index), args["dtype"])
        if kind in VIEW_KINDS:
            return self.value_at(args["self"], self._view_index(opdef, op, args, result, index))
        if kind in ("gather", "index_select"):
            return self._read_at(op, kind, args, out, index)
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            raise BackendError(f"{op.name}: kind '{kind}' cannot be inlined")
        return handler(opdef, args, out, index)

    def _elementwise(self, opdef: OpDef, args: dict, out, index: I.Index) -> L.Expr:
        types = {k: (v.type if isinstance(v, Value) else v) for k, v in args.items()}
        compute, result = rules.elementwise_dtypes(opdef, types)
        env: dict[str, Any] = {}
        for k, v in args.items():
            if isinstance(v, Value):
                e = self.value_at(v, I.broadcast(index, out.shape, v.type.shape))
                # logical ops read their inputs as bools (a half one through float32, as eager)
                env[k] = X(cast(e, e.dtype.compute) if opdef.dtype_rule == "logical" else cast(e, compute))
            else:
                env[k] = v
        value = elementwise.evaluate(opdef, env, PRIMITIVES, result)
        return cast(lift(value, compute), result)

    def _view_index(self, opdef: OpDef, op: Op, args: dict, result: int, index: I.Index) -> I.Index:
        src = args["self"].type.shape
        kind = opdef.kind
        if kind in ("reshape", "squeeze", "unsqueeze"):
            return I.reshape(index, op.results[0].type.shape, src)
        if kind == "flip":
            return I.flip(index, rules.flip_dims(opdef, args["dims"], src), src)
        if kind == "permute":
            return I.permute(index, tuple(d % len(src) for d in args["dims"]))
        if kind == "expand":
            return I.broadcast(index, op.results[0].type.shape, src)
        dim = args["dim"] % max(len(src), 1)
        if kind == "select":
            return I.select(index, dim, rules.wrap_index(args["index"], src[dim]))
        if kind == "slice":
            start, _, step = rules.slice_bounds(src[dim], args["start"], args["end"], args["step"])
            return I.offset(index, dim, start, step)
        start = sum(r.type.shape[dim] for r in op.results[:result])          # split
        return I.offset(index, dim, start)

    def indirect(self, op: Op, dim: int, index_value: Value, at: I.Index, size) -> L.Expr:
        """The position along `dim` (of `size`) that `op` reaches through its index operand
        `index_value` read at `at`: checked against the dim and clamped into it."""
        raw = cast(self.value_at(index_value, at), L.INDEX)
        if self.indices is None:
            wrapped = L.Select(L.Binary("lt", raw, I.ic(0), dt.BOOL), I.add(raw, size), raw, L.INDEX)
            return I.clamp(wrapped, 0, size - 1)
        return self.indices.index(op, dim, index_value, raw, size)

    def _read_at(self, op: Op, kind: str, args: dict, out, index: I.Index) -> L.Expr:
        """gather and index_select: `self` at the index with dim d replaced by the index read."""
        x = args["self"].type
        if out.numel == 0:           # an empty index of any rank: nothing is ever read
            return const(0, out.dtype)
        if x.ndim == 0:
            return self.value_at(args["self"], ())
        d = args["dim"] % x.ndim
        at = index if kind == "gather" else ((index[d],) if args["index"].type.ndim else ())
        i = self.indirect(op, d, args["index"], at, x.shape[d])
        return self.value_at(args["self"], index[:d] + (i,) + index[d + 1:])

    def _cat(self, opdef, args, out, index):
        """Nested selects on the concat dim; each piece's index is clamped into its own range."""
        d = args["dim"] % out.ndim
        pieces, start = [], 0
        tensors = args["tensors"]
        for v in [tensors[i] for i in rules.cat_kept([t.type.shape for t in tensors])]:
            pieces.append((start, v))
            start += v.type.shape[d]
        expr = None
        for start, v in reversed(pieces):
            size = v.type.shape[d]
            local = I.clamp(I.sub(index[d], start), 0, max(size - 1, 0))
            e = cast(self.value_at(v, index[:d] + (local,) + index[d + 1:]), out.dtype)
            end = L.Binary("lt", index[d], I.ic(start + size), dt.BOOL)
            expr = e if expr is None else L.Select(end, e, expr, out.dtype)
        return expr

    def _select_backward(self, opdef, args, out, index):
        d = args["dim"] % out.ndim
        at = rules.wrap_index(args["index"], out.shape[d])
        inside = L.Binary("eq", index[d], I.ic(at), dt.BOOL)
        g = cast(self.value_at(args["grad_output"], index[:d] + index[d + 1:]), out.dtype)
        return L.Select(inside, g, const(0, out.dtype), out.dtype)

    def _slice_backward(self, opdef, args, out, index):
        d = args["dim"] % out.ndim
        grad = args["grad_output"]
        n, step = grad.type.shape[d], args["step"]
        start, _, _ = rules.slice_bounds(out.shape[d], args["start"], args["end"], step)
        j = I.sub(index[d], start)
        k = I.clamp(I.floordiv(j, step), 0, I.at_least(I.sub(I.ic(n), 1), 0))     # (n may be dynamic)
        inside = L.Binary("and", L.Binary("ge", j, I.ic(0), dt.BOOL), L.Binary("lt", j, I.ic(n * step), dt.BOOL), dt.BOOL)
        if step != 1:
            on_step = L.Binary("eq", I.mod(j, step), I.ic(0), dt.BOOL)
            inside = L.Binary("and", inside, on_step, dt.BOOL)
        g = cast(self.value_at(grad, index[:d] + (k,) + index[d + 1:]), out.dtype)
        return L.Select(inside, g, const(0, out.dtype), out.dtype) if n else const(0, out.dtype)

    def _im2col(self, opdef, args, out, index):
        """Row (c, ki, kj) and column (oh, ow) of the window matrix read the input at
        (oh*s - p + ki*d, ow*s - p + kj*d); padding reads as 0."""
        x = args["self"]
        (kh, kw), dilation, padding, stride = args["kernel_size"], args["dilation"], args["padding"], args["stride"]
        counts = rules.window_counts(opdef, x.type.shape[-2:], (kh, kw), dilation, padding, stride)
        row, column = index[-2], index[-1]
        kernel_at = (I.mod(I.floordiv(row, kw), kh), I.mod(row, kw))
        window_at = (I.floordiv(column, counts[1]), I.mod(column, counts[1]))
        at, inside = [], []
        for w, k, d, p, s, n in zip(window_at, kernel_at, dilation, padding, stride, x.type.shape[-2:]):
            pos = I.add(I.sub(I.mul(w, s), p), I.mul(k, d))
            if is_dynamic(p) or p:      # only a padded input reads outside itself
                inside += [L.Binary("ge", pos, I.ic(0), dt.BOOL), L.Binary("lt", pos, I.ic(n), dt.BOOL)]
                pos = I.clamp(pos, 0, n - 1)
            at.append(pos)
        value = self.value_at(x, index[:-2] + (I.floordiv(row, kh * kw),) + tuple(at))
        return _where_all(inside, value, out.dtype)

    def _col2im(self, opdef, args, out, index):
        """The sum, over kernel positions (ki, kj), of the window-matrix entries that read
        this output element: those windows whose start (oh*s - p) + ki*d lands here."""
        cols = args["self"]
        (kh, kw), dilation, padding, stride = args["kernel_size"], args["dilation"], args["padding"], args["stride"]
        size = tuple(args["output_size"])
        counts = rules.window_counts(opdef, size, (kh, kw), dilation, padding, stride)
        total = None
        for ki in range(kh):
            for kj in range(kw):
                at, inside = [], []
                for pos, k, d, p, s, n, m in zip(index[-2:], (ki, kj), dilation, padding, stride, size, counts):
                    shifted = I.add(pos, p - k * d)          # oh*s for the window that reads here
                    # (a dynamic size keeps each check that does not hold for every size)
                    if not provably(lambda: p - k * d >= 0):
                        inside.append(L.Binary("ge", shifted, I.ic(0), dt.BOOL))
                    if not provably(lambda: n - 1 + p - k * d < m * s):
                        inside.append(L.Binary("lt", shifted, I.ic(m * s), dt.BOOL))
                    if s > 1:
                        inside.append(L.Binary("eq", I.mod(shifted, s), I.ic(0), dt.BOOL))
                    window = I.floordiv(shifted, s) if s > 1 else shifted
                    at.append(window)
                row = I.add(I.mul(index[-3], kh * kw), ki * kw + kj)
                term = self._guarded_at(cols, index[:-3] + (row,), at, counts, inside, out.dtype)
                total = term if total is None else L.Binary("add", total, term, out.dtype)
        return total

    def _guarded_at(self, cols: Value, lead: tuple, at: list, counts, inside: list, dtype) -> L.Expr:
        """cols[lead..., at[0] * counts[1] + at[1]] where `inside` holds, else 0.  A window
        matrix in memory is read by a GuardedLoad at the unclamped index (loaded only where
        the tap lands inside; a clamped index made every tap a gather); one computed inline,
        at the index clamped into range."""
        column = I.add(I.mul(at[0], counts[1]), at[1])
        value = self.value_at(cols, lead + (column,))
        if inside and type(value) is L.Load:
            return cast(L.GuardedLoad(value.buffer, value.index, value.dtype, _all(inside)), dtype)
        clamped = tuple(I.clamp(a, 0, m - 1) for a, m in zip(at, counts)) if inside else tuple(at)
        column = I.add(I.mul(clamped[0], counts[1]), clamped[1])
        return _where_all(inside, cast(self.value_at(cols, lead + (column,)), dtype), dtype)

    def _constant_pad_nd(self, opdef, args, out, index):
        """The input at index - before in every padded dim, where that lies inside it; value elsewhere."""
        x = args["self"]
        fill = const(args["value"], out.dtype)
        if x.type.numel == 0:           # nothing to read: all padding
            return fill
        at, inside = [], []
        pairs = rules.pad_pairs(opdef, args["pad"], x.type.shape)
        for d, (n, (lo, hi)) in enumerate(zip(x.type.shape, pairs)):
            if (lo, hi) == (0, 0):
                at.append(index[d])
                continue
            j = I.sub(index[d], lo)
            at.append(I.clamp(j, 0, n - 1))
            inside += [L.Binary("ge", j, I.ic(0), dt.BOOL), L.Binary("lt", j, I.ic(n), dt.BOOL)]
        return _where_all(inside, cast(self.value_at(x, tuple(at)), out.dtype), out.dtype, fill)

    def _full(self, opdef, args, out, index):
        return const(args["fill_value"], out.dtype)

    def _arange(self, opdef, args, out, index):
        start, _, step = rules.arange_bounds(args, out.dtype)
        if out.dtype.is_floating_point:
            i = L.Cast(index[0], dt.FLOAT64)
            return cast(L.Binary("add", L.Binary("mul", i, const(step, dt.FLOAT64), dt.FLOAT64),
                                 const(start, dt.FLOAT64), dt.FLOAT64), out.dtype)
        return L.Cast(I.add(I.mul(index[0], int(step)), int(start)), out.dtype)


def _all(conditions: list) -> L.Expr:
    test = conditions[0]
    for c in conditions[1:]:
        test = L.Binary("and", test, c, dt.BOOL)
    return test


def _where_all(conditions: list, value: L.Expr, dtype, otherwise: L.Expr | None = None) -> L.Expr:
    """value where every condition holds, else `otherwise` (0)."""
    if not conditions:
        return value
    return L.Select(_all(conditions), value, const(0, dtype) if otherwise is None else otherwise, dtype)


def _scalar_constant(value: np.ndarray, dtype) -> L.Expr:
    """0-d and splat constants inline; others must have been given a buffer."""
    flat = value.reshape(-1)
    if flat.size == 0 or np.array_equal(flat, np.full_like(flat, flat[0]), equal_nan=dt.is_float_array_dtype(flat.dtype)):
        return const(flat[0].item() if flat.size else 0, dtype)
    raise BackendError("a non-splat constant needs a buffer")
