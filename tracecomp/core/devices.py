"""Where a tensor's values live: `tc.device` and the base class of device memory.

A tensor's values are a NumPy array in host memory ("cpu") or a DeviceBuffer in the
memory of a GPU ("cuda", runtime/cuda/memory.py).  Only that module knows how device
memory is made and moved; the tensor and the dispatcher ask only which device a buffer
is on, which is why the base class lives here, below both.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import numpy as np

from .errors import ArgumentError

TYPES = ("cpu", "cuda")


class Device:
    """`tc.device("cuda")`, `tc.device("cuda:0")`, `tc.device("cpu")`: PyTorch's spelling,
    and equal to those strings (`x.device == "cuda"` holds for cuda:0, as "cuda" means the
    current device, which is device 0: tracecomp runs on one GPU)."""
    __slots__ = ("type", "index")

    def __init__(self, spec: Any, index: int | None = None):
        if hasattr(spec, "type") and hasattr(spec, "index"):       # a Device, or a torch.device
            spec, index = spec.type, spec.index if index is None else index
        if not isinstance(spec, str):
            raise ArgumentError(f"a device is 'cpu', 'cuda' or 'cuda:N', not {spec!r}")
        kind, _, number = spec.partition(":")
        if kind not in TYPES or (number and not number.isdigit()):
            raise ArgumentError(f"unknown device {spec!r}: tracecomp has {', '.join(TYPES)} (and 'cuda:N')")
        if number:
            index = int(number)
        if kind == "cuda":
            index = 0 if index is None else int(index)
            if index != 0:
                raise ArgumentError(f"device {spec!r}: tracecomp runs on one GPU, cuda:0")
        self.type = kind
        self.index = index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except ArgumentError:
                return False
        return isinstance(other, Device) and (self.type, self.index or 0) == (other.type, other.index or 0)

    def __hash__(self) -> int:
        return hash(self.type)


CPU = Device("cpu")
CUDA = Device("cuda")


class DeviceBuffer:
    """Values in a device's memory, C-contiguous, of one shape and NumPy dtype.  A subclass
    frees its memory when the last reference goes (runtime/cuda/memory.py)."""
    shape: tuple[int, ...]
    dtype: np.dtype
    device: Device = CUDA

    def to_host(self) -> np.ndarray:
        """A host copy of the values (waits for the device work that writes them)."""
        raise NotImplementedError

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


# DLPack device type -> a function making a DeviceBuffer over such an array (zero copy):
# runtime/cuda/memory.py registers kDLCUDA's, so tc.from_dlpack (tensors/) takes GPU arrays
# without knowing how device memory is held.
dlpack_importers: dict[int, Callable[[Any], DeviceBuffer]] = {}
# Host arrays NumPy's DLPack cannot carry (bfloat16): runtime/host_dlpack.py registers
# "export" (array -> capsule) and "import" (producer -> NumPy array sharing its memory).
host_dlpack: dict[str, Callable[[Any], Any]] = {}


def device_of(data: Any) -> Device:
    """The device of a tensor's values (a NumPy array is on the cpu)."""
    return data.device if isinstance(data, DeviceBuffer) else CPU


class _Made(threading.local):
    device: Device | None = None


_made = _Made()


def default_device() -> Device | None:
    """Where a factory called without a device puts its tensor: None (the cpu), except
    while a composite op's program runs on GPU tensors (library/composites.py)."""
    return _made.device


@contextlib.contextmanager
def making_on(device: Device):
    before, _made.device = _made.device, device
    try:
        yield
    finally:
        _made.device = before
