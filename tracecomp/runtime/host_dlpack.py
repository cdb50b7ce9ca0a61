"""DLPack on the host for the dtype NumPy's own DLPack lacks: bfloat16 (kDLBfloat).

`torch.from_dlpack(tc_tensor)` and `tc.tensor(torch_tensor)` share bfloat16 memory through
the ctypes structs of cuda/dlpack.py; every other dtype goes through NumPy's DLPack.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.devices import host_dlpack
from ..core.errors import ArgumentError
from .cuda import dlpack


def export(array: np.ndarray):
    """A "dltensor" capsule sharing `array` (copied first if not C-contiguous)."""
    array = np.ascontiguousarray(array)
    return dlpack.to_capsule(array.ctypes.data, array.shape, array.dtype, (dlpack.kDLCPU, 0), owner=array)


class _Shared:
    """Keeps the producer's memory alive for as long as a NumPy array over it lives."""

    def __init__(self, imported: dlpack.Imported):
        self.imported = imported
        itemsize = imported.dtype.itemsize
        self.__array_interface__ = {
            "data": (imported.ptr, False), "shape": imported.shape, "version": 3,
            "typestr": f"<u{itemsize}", "strides": tuple(s * itemsize for s in imported.strides)}


def import_(x: Any) -> np.ndarray:
    """A NumPy array sharing the host memory of DLPack producer `x` (a torch.Tensor)."""
    imported = dlpack.from_object(x)
    if imported.device[0] != dlpack.kDLCPU:
        raise ArgumentError(f"from_dlpack: the array is on DLPack device {imported.device}, not the CPU")
    return np.asarray(_Shared(imported)).view(imported.dtype)


host_dlpack.update({"export": export, "import": import_})
