"""The CPU dispatch key: eager execution on NumPy, derived from the table.

Composite ops run their decomposition through the public API (so every key above sees
the primitive ops, like PyTorch's CompositeImplicitAutograd); all others infer result
types with the shape rules and run the NumPy kernel of their kind.
"""
from __future__ import annotations

from typing import Any

from ..ops import rules
from ..ops.table import OpDef
from ..tensors.results import map_tensors, package, type_args
from ..ops import numpy_kernels


def cpu_kernel(op: OpDef, args: dict[str, Any]):
    from ..library.composites import run_composite
    from ..tensors.tensor import Tensor
    if op.kind == "composite":
        return run_composite(op, args)
    out_types = rules.infer(op, type_args(args))
    outs = numpy_kernels.run(op, map_tensors(args, lambda t: t._data), out_types)
    return package(op, [Tensor.from_numpy(o) for o in outs])
