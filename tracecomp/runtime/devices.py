"""Moving tensors between host and GPU memory: `x.to("cuda")`, `x.cuda()`, `x.cpu()`.

A move is not an op of the graph: inside tc.trace a tensor has no memory, and the traced
function runs wholly on the device it was traced for, so there a move is the tensor
itself.  Eagerly it copies the values and, where autograd records, gives the copy a
ToCopyBackward0 node that moves the gradient back (PyTorch's ToCopyBackward0).
"""
from __future__ import annotations

import numpy as np

from ..autograd.backward import gradient_edge
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.node import Node
from ..core.devices import Device, device_of
from ..core.errors import ArgumentError
from ..tensors.tensor import Tensor
from .cuda import memory


class ToCopyBackward0(Node):
    """The gradient of a move between devices: the same move, backwards."""

    def __init__(self, source: Device, edge, loc=None):
        super().__init__([edge], 1, loc)
        self.source = source

    def apply(self, grads: list) -> list:
        g = grads[0]
        return [None if g is None else transfer(g, self.source)]


def move_data(data, device: Device):
    """`data` (a NumPy array or a DeviceBuffer) as values on `device`."""
    if device_of(data) == device:
        return data
    if device.type == "cuda":
        return memory.DeviceArray.from_host(np.asarray(data))
    return data.to_host()


def transfer(t: Tensor, device) -> Tensor:
    """`t` on `device`: itself where it is there already (as PyTorch's .to), or while traced."""
    device = Device(device)
    if t._data is None or device_of(t._data) == device:
        return t
    if t._batch is not None:
        raise ArgumentError(f"moving a tensor to {device} inside tc.vmap is not supported; "
                            "move the inputs before calling the mapped function")
    source = device_of(t._data)
    out = Tensor(move_data(t._data, device), t._type)
    if t.requires_grad and is_grad_enabled():
        out.requires_grad = True
        out.grad_fn = ToCopyBackward0(source, gradient_edge(t))
    return out

