"""Common-subexpression elimination.

Before: a well-formed graph.  After: of several ops with the same name, the same operands
(after earlier merges), equal attributes and the same result types, only the first
remains and the others' uses read its results.  Attributes compare exactly: arrays by
dtype, shape and bytes, floats by their bits (so 0.0 and -0.0, or 1 and 1.0 and True,
stay apart).  Nondeterministic ops (rand, randn) are never merged: two draws differ.
Inside regions ops merge too, each region with a table of its own (an op inside never
reads a value of the graph around it: regions are isolated); ops with regions never merge.
"""
from __future__ import annotations

from typing import Any, Hashable

import numpy as np

from ...ops.table import by_ir_name
from ..graph import Graph, Op
from .rewrite import RuleResult, Rewriter, rewrite


def freeze(value: Any) -> Hashable:
    """A hashable key for an attribute value that is equal only for identical values."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (float, np.floating)):
        return ("float", float(value).hex())   # hex keeps -0.0 and each NaN payload apart
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(freeze(v) for v in value)
    return (type(value).__name__, value)


def op_key(op: Op) -> Hashable:
    attrs = tuple(sorted((k, freeze(v)) for k, v in op.attrs.items()))
    return (op.name, tuple(op.operands), attrs, tuple(r.type for r in op.results))


def cse(graph: Graph) -> Graph:
    """The graph with repeated deterministic ops merged into their first occurrence."""
    table = by_ir_name()
    seen: dict[Hashable, list] = {}

    def rule(op: Op, rw: Rewriter) -> RuleResult:
        opdef = table.get(op.name)
        if opdef is not None and opdef.nondeterministic:
            return None
        # operands are new-graph values, so merges chain; one table per graph, as a region
        # (rewritten with this rule too) must not read a value of the graph around it;
        # region ops have bodies of their own and are never merged
        key = (id(rw.graph), op_key(op), tuple(id(r) for r in op.regions))
        if key in seen:
            return seen[key]
        seen[key] = rw.add(op.name, op.operands, op.attrs, [r.type for r in op.results], op.loc,
                           op.regions).results
        return seen[key]
    return rewrite(graph, rule)
