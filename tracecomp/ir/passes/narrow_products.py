"""Products of widened half tensors read the half tensors: views move above the widening cast.

Before: a float32 `tc.matmul` may read a view (permute, reshape, expand, ...) of a
widening cast `to(x, float32)` of a bfloat16/float16 tensor x, as linear's `w.t()` and
the backward's `x.mT @ g` do under autocast, or im2col's window matrix of such a cast (a
convolution).  After: such an operand is `to(view(x),
float32)`, the same values (a widening cast is exact and commutes with any view), so the
scheduler (lower/schedule/matmul.py `_half_source`) finds the half tensor under the cast
and the packed GEMM reads it in its half dtype (the bf16 kernel where both operands are
bfloat16) instead of a float32 copy.  The product still accumulates in float32.
Runs after simplify, whose row reshapes (batch_into_rows) are views of the same kind.
"""
from __future__ import annotations

from ...core.dtypes import FLOAT32
from ...core.types import TensorType
from ...ops.table import VIEW_KINDS, by_ir_name
from ..graph import Graph, Op, Value
from .rewrite import Rewriter, RuleResult, rewrite
from .widen_half import CAST

MATMUL = "tc.matmul"
# one result each; im2col too: it only moves elements (and zeros), so it commutes with the
# widening cast and a convolution's window matrix stays half (llvm/gemm/halfwindows.py)
_VIEWS = tuple(k for k in VIEW_KINDS if k != "split") + ("im2col",)


def narrow_products(graph: Graph) -> Graph:
    """The graph with each matmul's widened-half operands read through the cast (see above)."""
    return rewrite(graph, _narrow)


def _narrow(op: Op, rw: Rewriter) -> RuleResult:
    if op.name != MATMUL:
        return None
    operands = [_through_cast(rw, v) for v in op.operands]
    if all(new is old for new, old in zip(operands, op.operands)):
        return None
    return rw.add(op.name, operands, op.attrs, [r.type for r in op.results], op.loc).results


def _through_cast(rw: Rewriter, v: Value) -> Value:
    """`to(views(x), float32)` for `v = views(to(x, float32))` with x half and at least one view; else v."""
    views = []
    while v.type.dtype is FLOAT32 and v.op is not None and len(v.op.results) == 1 \
            and _is_view(v.op) and v.op.operands:
        views.append(v.op)
        v = v.op.operands[0]
    if not views or v.op is None or v.op.name != CAST or v.type.dtype is not FLOAT32:
        return views[0].result if views else v
    x = v.op.operands[0]
    if not (isinstance(x.type, TensorType) and x.type.dtype.is_half):
        return views[0].result
    for view in reversed(views):
        shape = view.result.type.shape
        x = rw.add(view.name, [x, *view.operands[1:]], view.attrs, [TensorType(shape, x.type.dtype)],
                   view.loc).result
    return rw.add(CAST, [x], {"dtype": FLOAT32}, [TensorType(x.type.shape, FLOAT32)], views[0].loc).result


def _is_view(op: Op) -> bool:
    opdef = by_ir_name().get(op.name)
    return opdef is not None and opdef.kind in _VIEWS
