"""The rewrite driver every pass shares: copy a graph op by op, letting a rule replace ops.

`rewrite(graph, rule)` walks the ops in order and builds a new graph (the input graph is
never modified).  For each op the rule gets a detached copy whose operands are already
the new graph's values (so a rule looking at `op.operands[0].op` sees the rewritten
producer) and whose results are the old graph's values (for their types, and as keys of
what the old graph computed).  The rule returns
  None          keep the op: it is copied into the new graph;
  [Value, ...]  one new-graph value per result: uses of the old results now use these;
  DROP          delete the op: only ops that are dropped too may use its results (a rule
                for such an op sees the old result among its operands).
Rules create ops with `Rewriter.add` / `Rewriter.constant`.
The regions of a control-flow op (the body of a tc.scan) are rewritten first, by the same
rule, each as a graph of its own (regions are isolated from above), so every pass built
on this driver also works inside loop bodies and branches.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Union

import numpy as np

from ...core.errors import IRError
from ..graph import CONSTANT, Graph, Op, Value
from ...core.types import TensorType
from ...core.locations import Location


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()
RuleResult = Union[list[Value], _Drop, None]


class Rewriter:
    """The graph being built and the map from old values to new ones."""

    def __init__(self, old: Graph):
        self.old = old
        self.graph = Graph(old.name, [v.type for v in old.inputs])
        self.mapping: dict[Value, Value] = dict(zip(old.inputs, self.graph.inputs))
        self.dropped: set[Value] = set()     # results of dropped ops, in the old graph

    def add(self, name: str, operands: list[Value], attrs: dict[str, Any],
            result_types: list[TensorType], loc: Location | None, regions=()) -> Op:
        return self.graph.add_op(name, operands, attrs, result_types, loc, regions)

    @functools.cached_property
    def old_uses(self) -> dict[Value, int]:
        """How many times each value of the old graph is used (being an output counts)."""
        uses: dict[Value, int] = {}
        for v in [v for op in self.old.ops for v in op.operands] + list(self.old.outputs):
            uses[v] = uses.get(v, 0) + 1
        return uses

    def constant(self, array: np.ndarray, type: TensorType, loc: Location | None) -> Value:
        return self.add(CONSTANT, [], {"value": array}, [type], loc).result

    def value(self, old: Value, user: str) -> Value:
        """The new value for `old`; raises IRError if `old` is undefined or dropped."""
        if old not in self.mapping:
            why = "whose defining op the pass dropped" if old in self.dropped else "that is not defined"
            raise IRError(f"{user} uses a value {why} in the graph being rewritten: {old!r}")
        return self.mapping[old]


def rewrite(graph: Graph, rule: Callable[[Op, Rewriter], RuleResult]) -> Graph:
    """A new graph: `graph` with each op kept, replaced or dropped as `rule` says."""
    rw = Rewriter(graph)
    for old in graph.ops:
        where = f"op '{old.name}' (at {old.loc})"
        operands = [v if v in rw.dropped else rw.value(v, where) for v in old.operands]
        op = Op(old.name, operands, dict(old.attrs), old.results, old.loc,
                [rewrite(region, rule) for region in old.regions])
        out = rule(op, rw)
        if out is DROP:
            rw.dropped.update(old.results)
            continue
        if out is None:
            operands = [rw.value(v, where) for v in old.operands]   # refuses dropped values
            out = rw.add(op.name, operands, op.attrs, [r.type for r in old.results], op.loc,
                         op.regions).results
        if len(out) != len(old.results):
            raise IRError(f"a rewrite of {where} gave {len(out)} values for its "
                          f"{len(old.results)} results")
        rw.mapping.update(zip(old.results, out))
    rw.graph.outputs = [rw.value(v, "the graph's return") for v in graph.outputs]
    return rw.graph


def is_constant(value: Value) -> bool:
    return value.op is not None and value.op.name == CONSTANT
