"""Constant folding.

Before: a well-formed graph.  After: every op whose operands are all `tc.constant`
results (factories have none), which is deterministic, not composite and holds no
regions (the control pass picks a constant cond's branch), and whose results each hold
at most `limit` elements, is replaced by one `tc.constant` per result, computed by the
injected evaluator at the op's location.  Ops inside regions fold too (the rewrite
driver rewrites regions with the same rule), each region with its own constants.
Folding runs in order, so chains of constant ops fold completely; the constants they
consumed may become dead (DCE removes them).  An op the evaluator refuses (a
TracecompError, e.g. an index out of bounds) stays, so the error still happens when the
graph runs.

The evaluator has the signature of `tracecomp.ops.numpy_kernels.run`:
`evaluate(opdef, arguments_by_name, result_types) -> list[ndarray]`.  It is a parameter
because ir/ knows nothing of backends.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...core.errors import IRError, TracecompError
from ...ops.table import OpDef, by_ir_name
from ...core.symbolic import Dim
from ..graph import Graph, Op
from ...core.types import TensorType
from .rewrite import RuleResult, Rewriter, is_constant, rewrite

Evaluator = Callable[[OpDef, dict[str, Any], list[TensorType]], list[np.ndarray]]
FOLD_LIMIT = 4096   # elements; larger results would bloat the graph text and the binary


def foldable(opdef: OpDef | None, op: Op, limit: int) -> bool:
    return (opdef is not None and opdef.kind not in ("composite", "region") and not opdef.nondeterministic
            and all(is_constant(v) for v in op.operands)
            and all(isinstance(d, int) for r in op.results for d in r.type.shape)   # no dynamic dims
            and not any(isinstance(a, Dim) or isinstance(a, tuple) and any(isinstance(d, Dim) for d in a)
                        for a in op.attrs.values())
            and all(r.type.numel <= limit for r in op.results))


def fold_constants(graph: Graph, evaluate: Evaluator, limit: int = FOLD_LIMIT) -> Graph:
    """The graph with its small constant subexpressions evaluated into `tc.constant`s."""
    table = by_ir_name()

    def rule(op: Op, rw: Rewriter) -> RuleResult:
        opdef = table.get(op.name)
        if not foldable(opdef, op, limit):
            return None
        args = opdef.arguments_from([v.op.attrs["value"] for v in op.operands], op.attrs)
        types = [r.type for r in op.results]
        try:
            arrays = evaluate(opdef, args, types)
        except TracecompError:
            return None
        return [rw.constant(_checked(a, t, op), t, op.loc) for a, t in zip(arrays, types)]
    return rewrite(graph, rule)


def _checked(array: np.ndarray, type: TensorType, op: Op) -> np.ndarray:
    """A private, writable copy (kernels may return views of their inputs) of exactly `type`."""
    array = np.array(array)
    if array.shape != type.shape or array.dtype != type.dtype.np:
        raise IRError(f"folding '{op.name}' (at {op.loc}): the evaluator returned an array of "
                      f"shape {array.shape} and dtype {array.dtype}, expected {type}")
    return array
