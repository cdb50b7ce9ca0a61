"""The reference backend: executes a decomposed graph op by op with the NumPy kernels.

It is the executor of `tc.trace(fn, backend="interp")` and the oracle compiled backends
are tested against.  It runs only primitive ops: composites must be decomposed first.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import BackendError, TracecompError, add_location
from ..ir import CONSTANT, Graph
from ..ir import regions as R
from ..ops import numpy_kernels
from ..ops.table import by_ir_name


def run_graph(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    if len(inputs) != len(graph.inputs):
        raise BackendError(f"graph @{graph.name} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    env = dict(zip(graph.inputs, inputs))
    table = by_ir_name()
    for op in graph.ops:
        if op.name == CONSTANT:
            env[op.result] = op.attrs["value"]
            continue
        if op.regions:
            env.update(zip(op.results, run_region_op(op, [env[v] for v in op.operands])))
            continue
        opdef = table.get(op.name)
        if opdef is None or opdef.kind == "composite":
            raise BackendError(f"the interpreter cannot run '{op.name}' (at {op.loc}): "
                               "unknown op, or a composite that was not decomposed")
        args = opdef.arguments_from([env[v] for v in op.operands], op.attrs)
        try:
            outs = numpy_kernels.run(opdef, args, [r.type for r in op.results])
        except TracecompError as e:     # data-dependent errors surface at run time: name the line
            raise add_location(e, str(op.loc) if op.loc else None) from None
        env.update(zip(op.results, outs))
    return [env[v] for v in graph.outputs]


def run_region_op(op, operands: list[np.ndarray]) -> list[np.ndarray]:
    """A control-flow op (ir/regions.py), its regions run by run_graph: the loop in Python."""
    if op.name == R.COND:
        return run_graph(op.regions[0] if bool(operands[0]) else op.regions[1], operands[1:])
    if op.name == R.WHILE:
        k = op.attrs["num_consts"]
        consts, carry = operands[:k], operands[k:]
        cond, body = op.regions
        while bool(run_graph(cond, consts + carry)[0]):
            carry = run_graph(body, consts + carry)
        return carry
    if op.name == R.SCAN:
        k, c, length = op.attrs["num_consts"], op.attrs["num_carry"], op.attrs["length"]
        consts, carry, xs = operands[:k], operands[k:k + c], operands[k + c:]
        body = op.regions[0]
        ys = [np.empty((length, *v.type.shape), v.type.dtype.np) for v in body.outputs[c:]]
        steps = range(length - 1, -1, -1) if op.attrs.get("reverse") else range(length)
        for i in steps:
            out = run_graph(body, consts + carry + [x[i] for x in xs])
            carry = out[:c]
            for y, row in zip(ys, out[c:]):
                y[i] = row
        return carry + ys
    raise BackendError(f"the interpreter cannot run '{op.name}' (at {op.loc}): unknown op with regions")
