"""The decomposition pass: every composite op replaced by the ops its program records.

Before: any ops of the table.  After: no op whose table entry is `composite`; each new op
carries the location of the composite it came from.  It lives beside the tracer, not in
ir/, because composite programs are written against the tensor API and are re-traced.

A traced graph holds no composite op (the dispatcher runs their programs while the trace
records), so this pass only copies it; graphs parsed from text may still hold some.
"""
from __future__ import annotations

from ..dispatch.dispatcher import dispatcher
from ..core.errors import IRError
from ..ir import CONSTANT, Graph
from ..ops.table import by_ir_name
from ..tensors.tensor import Tensor
from ..dispatch.tracer import TraceContext


def _result_values(result, ctx: TraceContext) -> list:
    tensors = list(result) if isinstance(result, (tuple, list)) else [result]
    return [ctx.value_of(t) for t in tensors if isinstance(t, Tensor)]


def decompose(graph: Graph) -> Graph:
    table = by_ir_name()
    new = Graph(graph.name, [v.type for v in graph.inputs])
    mapping = dict(zip(graph.inputs, new.inputs))
    ctx = TraceContext(new)
    with ctx:
        for op in graph.ops:
            operands = [mapping[v] for v in op.operands]
            opdef = table.get(op.name)
            if op.name == CONSTANT or opdef is None or opdef.kind != "composite":
                copy = new.add_op(op.name, operands, op.attrs, [r.type for r in op.results], op.loc,
                                  [decompose(r) for r in op.regions])
                mapping.update(zip(op.results, copy.results))
                continue
            # the composite's pieces keep its line and phase, and name it as their source
            with ctx.located(op.loc.derived(source=op.name) if op.loc is not None else None):
                args = opdef.arguments_from([ctx.wrap(v) for v in operands], op.attrs)
                values = _result_values(dispatcher.call(opdef, args), ctx)
            if [v.type for v in values] != [r.type for r in op.results]:
                raise IRError(f"decomposing {op.name} (at {op.loc}) produced types "
                              f"{[str(v.type) for v in values]}, expected "
                              f"{[str(r.type) for r in op.results]}")
            mapping.update(zip(op.results, values))
    new.outputs = [mapping[v] for v in graph.outputs]
    return new
