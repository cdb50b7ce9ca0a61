"""The rewrite driver every pass shares: copy a graph op by op, letting a rule replace ops.

`rewrite(graph, rule)` walks the ops in order and builds a new graph (the input graph is
never modified).  For each op the rule gets a detached copy whose operands are already
the new graph's values (so a rule looking at `op.operands[0].op` sees the rewritten
producer) and whose results are the old graph's values (for their types, and as keys of
what the old graph computed).  The rule returns
  None          keep the op: it is copied into the new graph;
  [Value, ...]  one new-graph value per result: uses of the old results now use these;
  DROP          delete the op: a later use of its results is an error.
Rules create ops with `Rewriter.add` / `Rewriter.constant`.
"""
from __future__ import annotations

from typing import Any, Callable, Union

import numpy as np

from ...errors import IRError
from ..graph import Graph, Op, Value
from ..types import Location, TensorType

CONSTANT = "tc.constant"


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()
RuleResult = Union[list[Value], _Drop, None]


class Rewriter:
    """The graph being built and the map from old values to new ones."""

    def __init__(self, old: Graph):
        self.graph = Graph(old.name, [v.type for v in old.inputs])
        self.mapping: dict[Value, Value] = dict(zip(old.inputs, self.graph.inputs))

    def add(self, name: str, operands: list[Value], attrs: dict[str, Any],
            result_types: list[TensorType], loc: Location | None) -> Op:
        return self.graph.add_op(name, operands, attrs, result_types, loc)

    def constant(self, array: np.ndarray, type: TensorType, loc: Location | None) -> Value:
        return self.add(CONSTANT, [], {"value": array}, [type], loc).result

    def value(self, old: Value, user: str) -> Value:
        if old not in self.mapping:
            raise IRError(f"{user} uses a value that is not defined in the graph being "
                          f"rewritten, or whose defining op a pass deleted: {old!r}")
        return self.mapping[old]


def rewrite(graph: Graph, rule: Callable[[Op, Rewriter], RuleResult]) -> Graph:
    """A new graph: `graph` with each op kept, replaced or dropped as `rule` says."""
    rw = Rewriter(graph)
    for old in graph.ops:
        where = f"op '{old.name}' (at {old.loc})"
        op = Op(old.name, [rw.value(v, where) for v in old.operands], dict(old.attrs),
                old.results, old.loc)
        out = rule(op, rw)
        if out is DROP:
            continue
        if out is None:
            out = rw.add(op.name, op.operands, op.attrs, [r.type for r in old.results], op.loc).results
        if len(out) != len(old.results):
            raise IRError(f"a rewrite of {where} gave {len(out)} values for its "
                          f"{len(old.results)} results")
        rw.mapping.update(zip(old.results, out))
    rw.graph.outputs = [rw.value(v, "the graph's return") for v in graph.outputs]
    return rw.graph


def is_constant(value: Value) -> bool:
    return value.op is not None and value.op.name == CONSTANT
