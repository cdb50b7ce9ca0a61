"""The reference backend: executes a decomposed graph op by op with the NumPy kernels.

It is the executor of `tc.trace(fn, backend="interp")` and the oracle compiled backends
are tested against.  It runs only primitive ops: composites must be decomposed first.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import BackendError, TracecompError, add_location
from ..ir import CONSTANT, Graph
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
