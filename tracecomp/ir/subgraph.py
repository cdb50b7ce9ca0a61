"""Cutting a set of ops out of a graph as a function of its own (e.g. the backward pass).

The new graph's inputs are the values its ops read but do not define (forward values,
function inputs), in first-use order; its outputs are the values of the cut that the rest
of the graph or the function's outputs use, in definition order.
"""
from __future__ import annotations

from .graph import Graph, Value


def extract(graph: Graph, ops: set, name: str) -> Graph:
    chosen = [op for op in graph.ops if op in ops]
    defined = {r for op in chosen for r in op.results}
    sub = Graph(name)
    mapping: dict[Value, Value] = {}
    for op in chosen:
        for v in op.operands:
            if v not in defined and v not in mapping:
                mapping[v] = sub.add_input(v.type)
        copy = sub.add_op(op.name, [mapping[v] for v in op.operands], op.attrs,
                          [r.type for r in op.results], op.loc, op.regions)
        mapping.update(zip(op.results, copy.results))
    used_outside = {v for op in graph.ops if op not in ops for v in op.operands} | set(graph.outputs)
    sub.outputs = [mapping[r] for op in chosen for r in op.results if r in used_outside]
    return sub
