"""Region ops as primitives: tracing a Python function into a region, and running a region
op through the dispatch keys.

A region op (tc.scan, tc.while_loop, tc.cond: ir/regions.py) takes functions, which no
ops.yaml schema can, so it does not go through the dispatcher's table: `bind` computes the
same key set from its tensor operands and runs this module's rule for the highest key
that has one, as PyTorch's higher-order operators (torch.cond, while_loop) and JAX's
primitives with jaxpr parameters do.  The rules (autodiff.py, batching.py) never call
the user's function again: they re-evaluate the traced region through the public ops
(`eval_graph`) under the transform they implement and trace the result into a new
region, then bind the op again below their key.
  Tracer  records the op in the graph being traced (the region's graph goes with it);
  CPU     runs it on eager tensors, with the reference interpreter's loop.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.errors import TraceError
from ..core.locations import user_location
from ..core.types import TensorType
from ..dispatch.dispatcher import DispatchKey, dispatcher, state
from ..dispatch.tracer import RegionTrace, current
from ..ir import CONSTANT, Graph, Op
from ..ir import regions as R
from ..ops.table import by_ir_name
from ..runtime.interpreter import run_region_op
from ..tensors.results import outputs as result_tensors
from ..tensors.tensor import Tensor, as_tensor

RULES: dict[tuple[str, DispatchKey], Callable] = {}


def rule(name: str, key: DispatchKey):
    def register(fn):
        RULES[(name, key)] = fn
        return fn
    return register


@dataclass
class Region:
    """A traced function: its graph (block arguments: captures first, then the arguments it
    was traced at) and the outer tensors it captured."""
    graph: Graph
    captured: list


def trace_region(fn: Callable, types: list[TensorType], name: str) -> Region:
    """Trace `fn(*tensors of these types) -> list of tensors` into a region graph."""
    graph = Graph(name, types)
    ctx = RegionTrace(graph)
    try:
        with ctx:
            outs = fn(*[ctx.wrap(v) for v in graph.inputs])
            graph.outputs = [ctx.value_of(as_tensor(o)) for o in outs]
    finally:
        changed = ctx.changed_captures()
    if changed:
        t = changed[0]
        raise TraceError(f"a loop body or branch changed a tensor from outside it in place "
                         f"({t.dtype.label}{list(t.shape)}) (at {user_location()}): a region runs as "
                         "a function of its inputs; return the new value (in the carry, or as a "
                         "result) instead of writing it")
    n = len(types)
    graph.inputs = graph.inputs[n:] + graph.inputs[:n]      # captures first: the op's consts
    return Region(graph, ctx.captured)


def share_captures(regions: list[Region]) -> list:
    """Give regions that one op holds (a while's cond and body, a cond's branches) the same
    consts: each region's graph gets a block argument for every capture of any of them.
    Returns the shared captured tensors."""
    shared: list = []
    for r in regions:
        for t in r.captured:
            if not any(t is s for s in shared):
                shared.append(t)
    for r in regions:
        k = len(r.captured)
        own = dict((id(t), v) for t, v in zip(r.captured, r.graph.inputs[:k]))
        consts = [own.get(id(t)) or Graph.add_input(r.graph, t._type) for t in shared]
        rest = [v for v in r.graph.inputs[k:] if all(v is not c for c in consts)]
        r.graph.inputs = consts + rest
        r.captured = list(shared)
    return shared


def bind(name: str, operands: list, attrs: dict, regions: list[Graph], below: DispatchKey | None = None) -> list:
    """Run region op `name` on tensor operands: the rule of the highest key that has one."""
    operands = [as_tensor(t) for t in operands]
    if state.region is not None:
        operands = [state.region.local(t) for t in operands]
    keys = dispatcher.keys_for({"operands": operands})
    for key in keys:
        if below is not None and key <= below:
            continue
        fn = RULES.get((name, key)) or RULES.get(("*", key))
        if fn is not None:
            return fn(name, operands, attrs, regions)
    raise TraceError(f"{name}: no rule for dispatch keys {[k.name for k in keys]}")


@rule("*", DispatchKey.Tracer)
def _record(name: str, operands: list, attrs: dict, regions: list[Graph]) -> list:
    ctx = current()
    values = [ctx.value_of(t) for t in operands]
    sig = R.signature(name, [v.type for v in values], attrs, [[v.type for v in r.outputs] for r in regions])
    op = ctx.record(name, values, attrs, list(sig.results), regions)
    return [ctx.wrap(v) for v in op.results]


@rule("*", DispatchKey.CPU)
def _run_eagerly(name: str, operands: list, attrs: dict, regions: list[Graph]) -> list:
    """The op on eager tensors: its loop runs in Python, the regions by the interpreter."""
    arrays = run_region_op(Op(name, [], attrs, [], None, regions), [t._data for t in operands])
    return [Tensor.from_numpy(np.asarray(a)) for a in arrays]


def eval_graph(graph: Graph, inputs: list) -> list:
    """`graph` evaluated on `inputs` through the public ops (each op dispatched as a user's
    call would be, at the op's own location): how a transform sees inside a region."""
    env = dict(zip(graph.inputs, inputs))
    table = by_ir_name()
    ctx = current()
    for op in graph.ops:
        where = ctx.located(op.loc) if ctx is not None and op.loc is not None else contextlib.nullcontext()
        with where:
            operands = [env[v] for v in op.operands]
            if op.name == CONSTANT:
                outs = [_constant(op.attrs["value"], op.result.type)]
            elif op.regions:
                outs = bind(op.name, operands, op.attrs, op.regions)
            else:
                opdef = table[op.name]
                outs = result_tensors(dispatcher.call(opdef, opdef.arguments_from(operands, op.attrs)))
        env.update(zip(op.results, outs))
    return [env[v] for v in graph.outputs]


def _constant(array: np.ndarray, type: TensorType) -> Tensor:
    ctx = current()
    if ctx is None:
        return Tensor.from_numpy(np.array(array))
    return ctx.wrap(ctx.record(CONSTANT, [], {"value": array}, [type]).result)
