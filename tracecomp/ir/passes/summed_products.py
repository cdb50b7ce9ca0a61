"""A batched product summed over its batch is one product over the batch's rows.

Before: `sum(x.mT @ g, dim=batch dims)` with x (B..., s, m) and g (B..., s, n), as the
gradient of a weight shared across a batch comes out of matmul's backward (a linear on
(batch, seq, d) activations).  After: `reshape(x, (B*s, m)).mT @ reshape(g, (B*s, n))`
(reshaped to the sum's keepdim shape): one float32 accumulation over all B*s rows, as
PyTorch computes it (its matmul folds the batch into rows, so its backward is this
product), instead of B products written out and summed.  Only the summation order
changes.  The batched product must have no other use.
"""
from __future__ import annotations

import math

from ...core.types import TensorType
from ..graph import Graph, Op, Value
from .rewrite import Rewriter, RuleResult, rewrite

MATMUL, SUM, PERMUTE, RESHAPE = "tc.matmul", "tc.sum", "tc.permute", "tc.reshape"


def summed_products(graph: Graph) -> Graph:
    """The graph with each batch-summed `x.mT @ g` as one product (see the module docstring)."""
    return rewrite(graph, _fold)


def _fold(op: Op, rw: Rewriter) -> RuleResult:
    if op.name != SUM or op.attrs.get("dtype") is not None or not _sole_use(op, rw):
        return None
    product = op.operands[0].op
    if product is None or product.name != MATMUL:
        return None
    a, g = product.operands
    out = product.result.type
    nb = out.ndim - 2
    x = _transposed(a)
    if nb < 1 or x is None or a.type.ndim != out.ndim or g.type.ndim != out.ndim \
            or a.type.shape[:nb] != out.shape[:nb] or g.type.shape[:nb] != out.shape[:nb]:
        return None
    if tuple(sorted(d % out.ndim for d in op.attrs.get("dim") or ())) != tuple(range(nb)):
        return None
    rows = math.prod(x.type.shape[:-1])
    m, n = x.type.shape[-1], g.type.shape[-1]
    xr = _add(rw, RESHAPE, x, {"shape": (rows, m)}, (rows, m), op)
    lhs = _add(rw, PERMUTE, xr, {"dims": (1, 0)}, (m, rows), op)
    rhs = _add(rw, RESHAPE, g, {"shape": (rows, n)}, (rows, n), op)
    flat = rw.add(MATMUL, [lhs, rhs], product.attrs, [TensorType((m, n), out.dtype)], product.loc).result
    want = op.results[0].type
    if want.shape == (m, n):
        return [flat]
    return [_add(rw, RESHAPE, flat, {"shape": want.shape}, want.shape, op)]


def _sole_use(op: Op, rw: Rewriter) -> bool:
    """Whether the sum is the only use of its (old graph) operand."""
    old = op.results[0].op.operands[0] if op.results[0].op is not None else None
    return old is not None and rw.old_uses.get(old, 0) == 1


def _transposed(a: Value) -> Value | None:
    """x where a = x.mT (a permute swapping only the last two dims), else None."""
    p = a.op
    k = a.type.ndim
    if p is None or p.name != PERMUTE or k < 2:
        return None
    dims = tuple(d % k for d in p.attrs["dims"])
    return p.operands[0] if dims == tuple(range(k - 2)) + (k - 1, k - 2) else None


def _add(rw: Rewriter, name: str, v: Value, attrs: dict, shape: tuple, at: Op) -> Value:
    return rw.add(name, [v], attrs, [TensorType(tuple(shape), v.type.dtype)], at.loc).result
