"""Algebraic simplification: a table of local patterns, keyed by op name.

Before: a well-formed graph.  After: each op that a pattern matches uses the value the
pattern returns instead (`x * 1` -> `x`, `reshape(reshape(x))` -> one reshape, ...).  A
pattern only proposes a replacement; it applies only when the replacement has exactly
the original result types, shape AND dtype, so `int_tensor * 1.0` (float result) and
`expand` to a larger shape stay.  Ops left without users are not removed here (DCE does).

A pattern is `fn(op, args, rw) -> list[Value] | None` where `args` are the op's arguments
by name (a Value for a tensor operand, a number where an elementwise op took a scalar).
Patterns see the rewritten graph, so chains (`neg(neg(neg(x)))`, reshape chains) reduce
in one walk.  Every pattern is exact: `x + 0.0` stays (it is +0.0 at x = -0.0), while
`x + (-0.0)` and `x - 0.0` are x.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...core.symbolic import is_dynamic
from ...core.types import TensorType
from ...ops.table import by_ir_name
from ..graph import Graph, Op, Value
from .rewrite import RuleResult, Rewriter, is_constant, rewrite

Args = dict[str, Any]
Replacement = list[Value] | None
Pattern = Callable[[Op, Args, Rewriter], Replacement]
VIEW_CHAIN = ("tc.reshape", "tc.squeeze", "tc.unsqueeze")   # keep row-major element order


def _const(x: Any) -> np.ndarray | None:
    """The value of a scalar argument or of a `tc.constant` operand; None otherwise."""
    if isinstance(x, Value):
        return x.op.attrs["value"] if is_constant(x) else None
    if isinstance(x, (bool, int, float, np.number, np.bool_)):
        return np.asarray(x)
    return None


def _is_all(x: Any, c: float) -> bool:
    value = _const(x)
    return value is not None and bool(np.all(value == c))


def _finite(x: Any) -> bool:
    """alpha * 0 is 0 only for a finite alpha (inf * 0 is nan)."""
    return isinstance(x, (bool, int, float, np.number, np.bool_)) and math.isfinite(x)


def _producer(x: Any, *names: str) -> Op | None:
    return x.op if isinstance(x, Value) and x.op is not None and x.op.name in names else None


# ---------------------------------------------------------------- arithmetic identities

def mul_by_one(op: Op, args: Args, rw: Rewriter) -> Replacement:
    if _is_all(args["other"], 1) and isinstance(args["self"], Value):
        return [args["self"]]
    if _is_all(args["self"], 1) and isinstance(args["other"], Value):
        return [args["other"]]
    return None


def add_zero(op: Op, args: Args, rw: Rewriter) -> Replacement:
    if _adds_nothing(op, args["other"], args["alpha"], 1) and isinstance(args["self"], Value):
        return [args["self"]]
    if args["alpha"] == 1 and _adds_nothing(op, args["self"], 1, 1) and isinstance(args["other"], Value):
        return [args["other"]]
    return None


def sub_zero(op: Op, args: Args, rw: Rewriter) -> Replacement:
    if _adds_nothing(op, args["other"], args["alpha"], -1) and isinstance(args["self"], Value):
        return [args["self"]]
    return None


def _adds_nothing(op: Op, zero: Any, alpha: Any, sign: int) -> bool:
    """Whether adding sign * alpha * zero leaves every value as it is: a zero, and for a
    float result a negative zero (x + 0.0 is +0.0 at x = -0.0; x + -0.0 is x everywhere)."""
    value = _const(zero)
    if value is None or not _finite(alpha) or not bool(np.all(value == 0)):
        return False
    if not op.results[0].type.dtype.is_floating_point:
        return True
    return bool(np.all(np.signbit(sign * alpha * value.astype(np.float64))))


def div_by_one(op: Op, args: Args, rw: Rewriter) -> Replacement:
    if _is_all(args["other"], 1) and isinstance(args["self"], Value):
        return [args["self"]]
    return None


def pow_small(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """x ** 1 -> x, x ** 2 -> x * x (both exact; the square is what backward of pow makes)."""
    x = args["self"]
    if not isinstance(x, Value) or isinstance(args["exponent"], Value):
        return None
    if _is_all(args["exponent"], 1):
        return [x]
    if _is_all(args["exponent"], 2) and x.type == op.results[0].type:    # not bool ** 2 (int64)
        return rw.add("tc.mul", [x, x], {}, [op.results[0].type], op.loc).results
    return None


def neg_neg(op: Op, args: Args, rw: Rewriter) -> Replacement:
    inner = _producer(args["self"], "tc.neg")
    return [inner.operands[0]] if inner is not None else None


# ---------------------------------------------------------------- shape ops

def same_type_identity(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """reshape/squeeze/expand to the same shape, cast to the same dtype: the input itself
    (the type check in `_simplify_op` decides whether the shape or dtype really is the same)."""
    return [args["self"]]


def reshape_of_view(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """reshape(reshape(x)), or of any chain of reshape/squeeze/unsqueeze: one reshape of
    the chain's input, or that input itself when the shape comes back."""
    source, inner = args["self"], _producer(args["self"], *VIEW_CHAIN)
    if inner is None:
        return None
    while inner is not None:
        source, inner = inner.operands[0], _producer(inner.operands[0], *VIEW_CHAIN)
    if source.type == op.results[0].type:
        return [source]
    return rw.add(op.name, [source], op.attrs, [op.results[0].type], op.loc).results


def view_chain_undone(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """squeeze(unsqueeze(x)), unsqueeze(squeeze(x)), ...: x when the shape comes back,
    since none of these ops moves elements."""
    inner = _producer(args["self"], *VIEW_CHAIN)
    return [inner.operands[0]] if inner is not None else None


def _dims(dims, ndim: int) -> tuple[int, ...]:
    return tuple(d % ndim for d in dims) if ndim else tuple(dims)


def permute_identity(op: Op, args: Args, rw: Rewriter) -> Replacement:
    x = args["self"]
    return [x] if _dims(args["dims"], x.type.ndim) == tuple(range(x.type.ndim)) else None


def permute_permute(op: Op, args: Args, rw: Rewriter) -> Replacement:
    inner = _producer(args["self"], "tc.permute")
    if inner is None:
        return None
    source = inner.operands[0]
    first = _dims(inner.attrs["dims"], source.type.ndim)
    dims = tuple(first[d] for d in _dims(args["dims"], source.type.ndim))
    if dims == tuple(range(source.type.ndim)):
        return [source]
    return rw.add(op.name, [source], {**op.attrs, "dims": dims}, [op.results[0].type], op.loc).results


def transposed_product(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """(a @ b).mT -> b.mT @ a.mT when nothing else uses a @ b: the matmul reads transposed
    operands in place, so the transpose costs nothing instead of a kernel of its own (the
    key gradient of attention, `(q.mT @ g).mT`)."""
    x, n = args["self"], args["self"].type.ndim
    inner = _producer(x, "tc.matmul")
    if inner is None or n < 2 or _dims(args["dims"], n) != tuple(range(n - 2)) + (n - 1, n - 2):
        return None
    a, b = inner.operands
    if a.type.ndim < 2 or b.type.ndim < 2 or rw.old_uses.get(op.results[0].op.operands[0], 0) != 1:
        return None

    def mT(v: Value) -> Value:
        """v.mT, composed with v's own permute if it has one (the rewrite visits each op
        once, so a permute of a permute made here would stay)."""
        k = v.type.ndim
        dims = tuple(range(k - 2)) + (k - 1, k - 2)
        shape = v.type.shape[:-2] + (v.type.shape[-1], v.type.shape[-2])
        inner = _producer(v, "tc.permute")
        if inner is not None:
            v, first = inner.operands[0], _dims(inner.attrs["dims"], k)
            dims = tuple(first[d] for d in dims)
            if dims == tuple(range(k)):
                return v
        return rw.add("tc.permute", [v], {"dims": dims}, [type(v.type)(shape, v.type.dtype)], op.loc).result
    return rw.add(inner.name, [mT(b), mT(a)], inner.attrs, [op.results[0].type], op.loc).results


def batch_into_rows(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """a @ w with a's batch dims dynamic and w a matrix: one product of a's rows,
    reshape(a, (-1, k)) @ w, reshaped back.  The packed GEMM takes run-time rows, but
    loops only over static batch dims (a linear layer on (batch, seq, dim) activations)."""
    a, w = args["self"], args["other"]
    shape = a.type.shape
    if w.type.ndim != 2 or a.type.ndim < 3 or not any(is_dynamic(d) for d in shape[:-2]):
        return None
    rows = math.prod(shape[:-1])
    flat = rw.add("tc.reshape", [a], {"shape": (rows, shape[-1])}, [TensorType((rows, shape[-1]), a.type.dtype)],
                  op.loc).result
    out = op.results[0].type
    product = rw.add(op.name, [flat, w], op.attrs, [TensorType((rows, out.shape[-1]), out.dtype)], op.loc).result
    return rw.add("tc.reshape", [product], {"shape": out.shape}, [out], op.loc).results


def scatter_nothing(op: Op, args: Args, rw: Rewriter) -> Replacement:
    """scatter_add/index_add with an empty index add nothing: the result is `self` (PyTorch
    accepts such an index whatever its shape, which the scatter loops cannot index by)."""
    return [args["self"]] if args["index"].type.numel == 0 else None


PATTERNS: dict[str, list[Pattern]] = {
    "tc.mul": [mul_by_one],
    "tc.add": [add_zero],
    "tc.sub": [sub_zero],
    "tc.div": [div_by_one],
    "tc.neg": [neg_neg],
    "tc.pow": [pow_small],
    "tc.reshape": [same_type_identity, reshape_of_view],
    "tc.squeeze": [same_type_identity, view_chain_undone],
    "tc.unsqueeze": [view_chain_undone],
    "tc.permute": [permute_identity, permute_permute, transposed_product],
    "tc.expand": [same_type_identity],
    "tc.to": [same_type_identity],
    "tc.matmul": [batch_into_rows],
    "tc.scatter_add": [scatter_nothing],
    "tc.index_add": [scatter_nothing],
}


def _simplify_op(op: Op, rw: Rewriter) -> RuleResult:
    patterns = PATTERNS.get(op.name)
    if not patterns:
        return None
    args = by_ir_name()[op.name].arguments_from(op.operands, op.attrs)
    for pattern in patterns:
        out = pattern(op, args, rw)
        if out is not None and [v.type for v in out] == [r.type for r in op.results]:
            return out
    return None


def simplify(graph: Graph) -> Graph:
    """The graph with the PATTERNS applied once over the ops, in order."""
    return rewrite(graph, _simplify_op)
