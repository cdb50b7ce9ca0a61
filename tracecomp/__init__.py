"""tracecomp: a tracing compiler for array programs.

The public API: tensors and the ops generated from ops.yaml (`tc.add`, `x.sum(dim=1)`, `x @ w`),
dtypes, `tc.trace` to record and compile functions.
"""
from __future__ import annotations

from .runtime.numpy_blas import short_spin_while_numpy_loads as _short_blas_spin

with _short_blas_spin():        # before anything loads NumPy: see numpy_blas.py
    import numpy as _numpy  # noqa: F401

from .core.dtypes import DType
from .core.dtypes import BOOL as bool, FLOAT32 as float32, FLOAT64 as float64, INT32 as int32, INT64 as int64
from .core.dtypes import BFLOAT16 as bfloat16, FLOAT16 as float16
from .core.errors import (ArgumentError, DTypeError, IndexingError, IndexTypeError, IRError,
                          OutOfMemoryError, ShapeError, TableError, TraceError, TracecompError)
from .tensors.factories import tensor
from .core.logs import configure as _configure_logging
from .core.random import manual_seed
from .tensors.tensor import Tensor, from_dlpack
from .core.devices import Device as device
from .runtime import cuda
from .runtime import host_dlpack as _host_dlpack  # noqa: F401  (bfloat16 through DLPack)
from .tensors.pytree import register_pytree_node, tree_map

from .core.version import __version__
float = float32        # PyTorch's aliases
double = float64
half = float16
long = int64
int = int32


def _install() -> None:
    from . import bindings
    from .library import composites  # noqa: F401  (registers how the dispatcher runs composite ops)
    from .dispatch import api
    from .autograd.kernels import autograd_kernel, forward_ad_kernel
    from .dispatch.batching import batched_kernel
    from .dispatch.dispatcher import DispatchKey, dispatcher
    from .dispatch.eager import cpu_kernel
    from .ops.table import default_table
    from .dispatch.tracer import trace_kernel
    from .transforms.eager_cuda import cuda_kernel
    table = default_table()
    dispatcher.register_fallback(DispatchKey.CUDA, cuda_kernel)
    for op in table.values():
        dispatcher.register(DispatchKey.CPU, op, cpu_kernel)
        dispatcher.register(DispatchKey.Tracer, op, trace_kernel)
        dispatcher.register(DispatchKey.Autograd, op, autograd_kernel)
        dispatcher.register(DispatchKey.ForwardAD, op, forward_ad_kernel)
        dispatcher.register(DispatchKey.Batched, op, batched_kernel)
    globals().update({name: getattr(api, name) for name in bindings.install(table)})


_install()
_configure_logging()

# These need the generated API.
from . import autograd  # noqa: E402
from .autograd.functional import grad, jvp, value_and_grad, vjp  # noqa: E402
from .transforms.jacobians import hessian, jacfwd, jacrev  # noqa: E402
from .transforms.gradcheck import GradcheckError, gradcheck, gradgradcheck  # noqa: E402
from .autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: E402
from .dispatch.autocast import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402
from .transforms.trace import trace  # noqa: E402
from .transforms.vmap import vmap  # noqa: E402
from .control import ControlFlowError, cond, fori_loop, scan, while_loop  # noqa: E402
from .tensors.checkpoint import CheckpointError, load_state, save  # noqa: E402
from . import utils  # noqa: E402
from . import optim  # noqa: E402
from .core.errors import VmapError  # noqa: E402
from . import linalg  # noqa: E402
from . import nn  # noqa: E402
from .aot.exporting import export  # noqa: E402
from .aot.loader import load  # noqa: E402
from .runtime.cache import settings as compile_cache  # noqa: E402


def __getattr__(name: str):
    """A name tracecomp lacks: say where the supported operators are listed, and whether
    PyTorch has it (when PyTorch is already imported: importing it here would cost a second)."""
    import sys
    torch = sys.modules.get("torch")
    known = "" if torch is None else (f"; PyTorch has torch.{name}, tracecomp does not (yet)"
                                      if hasattr(torch, name) else "; PyTorch has no torch." + name + " either")
    raise AttributeError(f"module 'tracecomp' has no attribute {name!r}{known}. The supported operators: "
                         f"`tracecomp ops` (or README.md, 'Supported operators')")
