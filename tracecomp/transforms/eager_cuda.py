"""The CUDA dispatch key: an op on tensors in GPU memory runs as that one op, traced and
compiled for the device (PyTorch's CUDA kernels, made by tracecomp's own compiler).

Each (op, non-tensor arguments, input types) is compiled once, on first use, by
tc.trace(device="cuda") and cached; its call queues the op's launches without waiting.
All tensor arguments must be on the GPU, except 0-d tensors, which are moved there (as
PyTorch lets a CPU scalar tensor meet a CUDA tensor).  Autograd records above this key as
it does for the CPU, so an eager training step runs on the device op by op; tracing the
whole step with tc.trace(device="cuda") fuses it and is the fast way.
"""
from __future__ import annotations

from typing import Any

from ..core.devices import CUDA, DeviceBuffer
from ..core.errors import ArgumentError
from ..dispatch.dispatcher import dispatcher
from ..ops.table import OpDef
from ..runtime.devices import move_data
from ..tensors.tensor import Tensor
from .trace import TracedFunction

_compiled: dict[tuple, TracedFunction] = {}


def _hashable(v: Any):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, float) and v != v:
        return ("nan",)
    return v


def _on_device(op: OpDef, name: str, t: Tensor, where: str) -> Tensor:
    if isinstance(t._data, DeviceBuffer):
        return t
    if t.ndim == 0:
        return Tensor(move_data(t._data, CUDA), t._type)
    raise ArgumentError(f"{op.full_name}: expected all tensors to be on the same device, but argument "
                        f"'{name}' is a {t.dtype.label}{list(t.shape)} tensor on the cpu and {where} on "
                        f"cuda:0 (move it with .to('cuda'), or the others with .cpu())")


def cuda_kernel(op: OpDef, args: dict[str, Any]):
    where = next(f"'{k}'" for k, v in args.items()
                 for t in (v if isinstance(v, (list, tuple)) else (v,))
                 if isinstance(t, Tensor) and isinstance(t._data, DeviceBuffer))
    tensors: list[Tensor] = []
    layout: dict[str, Any] = {}            # argument -> its tensors' positions, or the value itself
    for name, v in args.items():
        if isinstance(v, Tensor):
            layout[name] = ("tensor", len(tensors))
            tensors.append(_on_device(op, name, v, where))
        elif isinstance(v, (list, tuple)) and any(isinstance(t, Tensor) for t in v):
            slots = []
            for t in v:
                if isinstance(t, Tensor):
                    slots.append(len(tensors))
                    tensors.append(_on_device(op, name, t, where))
                else:
                    slots.append(("value", t))
            layout[name] = ("list", tuple(slots))
        else:
            layout[name] = ("value", _hashable(v))
    key = (op.full_name, tuple(layout.items()), tuple(t._type for t in tensors))
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = TracedFunction(_one_op(op, args, layout), device="cuda")
    return fn(*[Tensor(t._data, t._type) for t in tensors])


def _one_op(op: OpDef, args: dict[str, Any], layout: dict[str, Any]):
    values = {name: v for name, v in args.items() if layout[name][0] == "value"}

    def run(*tensors):
        call = dict(values)
        for name, (kind, where) in layout.items():
            if kind == "tensor":
                call[name] = tensors[where]
            elif kind == "list":
                call[name] = [tensors[s] if isinstance(s, int) else s[1] for s in where]
        return dispatcher.call(op, call)
    run.__name__ = op.ir_name.replace(".", "_")
    return run
