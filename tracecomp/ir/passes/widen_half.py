"""Half-precision arithmetic as float32 between two casts, as PyTorch's CPU kernels do it.

Before: a graph whose ops may take or give bfloat16/float16 tensors.  After: only casts,
constants, views, elementwise ops (whose dtype rule computes in float32 already, and whose
formula may ask for its result dtype: nan_to_num's finite maximum) and ops with regions
(whose bodies are rewritten the same way) touch a half-precision tensor; every other such
op reads its half operands cast to float32 (exact), computes in float32 (a sum or a
matmul accumulates there) and its half results are cast back, rounding once to nearest
even.  So a backend needs half types only for
loads, stores, casts and data movement, and a chain `exp(x * 2)` rounds after each op as
eager mode does (the casts between the ops are the rounding, and no pass folds a
`to(to(x, bf16), f32)` pair).
"""
from __future__ import annotations

from ...core.dtypes import FLOAT32, DType
from ...core.types import TensorType
from ...ops import rules
from ...ops.table import VIEW_KINDS, by_ir_name
from ..graph import CONSTANT, Graph, Op, Value
from .rewrite import Rewriter, RuleResult, rewrite

CAST = "tc.to"
_KEEP_KINDS = ("cast", "region", "elementwise", *VIEW_KINDS)   # exact, float32 inside, or rewritten inside


def widen_half(graph: Graph) -> Graph:
    """The graph with half-precision arithmetic widened (see the module docstring)."""
    return rewrite(graph, _widen)


def _widen(op: Op, rw: Rewriter) -> RuleResult:
    opdef = by_ir_name().get(op.name)
    if op.name == CONSTANT or opdef is None or opdef.kind in _KEEP_KINDS or not _touches_half(op):
        return None
    wide = [_cast(rw, v, FLOAT32, op) if _is_half(v.type) else v for v in op.operands]
    attrs = {k: (FLOAT32 if isinstance(a, DType) and a.is_half else a) for k, a in op.attrs.items()}
    types = rules.infer(opdef, opdef.arguments_from([v.type for v in wide], attrs))
    computed = rw.add(op.name, wide, attrs, types, op.loc)
    return [_cast(rw, value, old.type.dtype, op) if value.type != old.type else value
            for old, value in zip(op.results, computed.results)]


def _is_half(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.is_half


def _touches_half(op: Op) -> bool:
    return any(_is_half(v.type) for v in (*op.operands, *op.results)) or \
        any(isinstance(a, DType) and a.is_half for a in op.attrs.values())


def _cast(rw: Rewriter, v: Value, dtype: DType, at: Op) -> Value:
    return rw.add(CAST, [v], {"dtype": dtype}, [TensorType(v.type.shape, dtype)], at.loc).result
