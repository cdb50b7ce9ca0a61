"""The CPU dispatch key: eager execution on NumPy, derived from the table.

Ops infer result types with the shape rules and run the NumPy kernel of their kind
(composite ops never get here: the dispatcher runs their programs).
"""
from __future__ import annotations

from typing import Any

from ..ops import numpy_kernels, rules
from ..ops.table import OpDef
from ..tensors.results import map_tensors, package, type_args
from ..tensors.tensor import Tensor


def cpu_kernel(op: OpDef, args: dict[str, Any]):
    out_types = rules.infer(op, type_args(args))
    outs = numpy_kernels.run(op, map_tensors(args, lambda t: t._data), out_types)
    return package(op, [Tensor.from_numpy(o) for o in outs])
