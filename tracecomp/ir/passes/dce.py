"""Dead-code elimination.

Before: a well-formed graph.  After: the same graph without the ops none of whose results
reach an output, directly or through other live ops; the order of the remaining ops is
unchanged.  No op has side effects, so an unused `rand` or `randn` is dead as well (its
draw is simply not made).  Inside each region, what the region yields is its output: an
op with regions stays while one of its results is used, with every yield of its regions
(the control pass drops unused carries and ys).
"""
from __future__ import annotations

from ..graph import Graph, Op, Value
from .rewrite import DROP, RuleResult, Rewriter, rewrite


def live_values(graph: Graph) -> set[Value]:
    """The values an output depends on (a backward walk from the outputs)."""
    live = set(graph.outputs)
    for op in reversed(graph.ops):
        if any(r in live for r in op.results):
            live.update(op.operands)
    return live


def dce(graph: Graph) -> Graph:
    """The graph with its dead ops removed."""
    live: dict[int, set[Value]] = {}      # per graph: a region's body has its own outputs

    def rule(op: Op, rw: Rewriter) -> RuleResult:
        # op.results are the old graph's values, the ones `live` holds
        if id(rw.old) not in live:
            live[id(rw.old)] = live_values(rw.old)
        return None if any(r in live[id(rw.old)] for r in op.results) else DROP
    return rewrite(graph, rule)
