"""tracecomp: a tracing compiler for array programs.

The public API: tensors and the ops generated from ops.yaml (`tc.add`, `x.sum(dim=1)`, `x @ w`),
dtypes, `tc.trace` to record and compile functions.
"""
from __future__ import annotations

from .dtypes import DType
from .dtypes import BOOL as bool, FLOAT32 as float32, FLOAT64 as float64, INT32 as int32, INT64 as int64
from .errors import (ArgumentError, DTypeError, IRError, ShapeError, TableError, TraceError,
                     TracecompError)
from .factories import tensor
from .random import manual_seed
from .tensor import Tensor

__version__ = "0.1.0"
float = float32        # PyTorch's aliases
double = float64
long = int64
int = int32


def _install() -> None:
    from . import bindings
    from .dispatch import DispatchKey, dispatcher
    from .kernels.eager import cpu_kernel
    from .ops.table import default_table
    from .tracer import trace_kernel
    table = default_table()
    for op in table.values():
        dispatcher.register(DispatchKey.CPU, op, cpu_kernel)
        dispatcher.register(DispatchKey.Tracer, op, trace_kernel)
    bindings.install(table, globals())


_install()

from .trace import trace  # noqa: E402  (needs the generated API)
