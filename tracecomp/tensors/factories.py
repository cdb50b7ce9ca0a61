"""tc.tensor: building a Tensor from Python data (the one constructor that is not an op)."""
from __future__ import annotations

import numpy as np

from ..core import dtypes as dt
from ..core.devices import default_device
from .tensor import Tensor, as_tensor


def _infer_python_dtype(data) -> dt.DType:
    """PyTorch's rule for nested lists: any float -> float32, else any int -> int64, else bool."""
    flat = np.asarray(data, dtype=object).reshape(-1)
    if any(isinstance(x, (float, np.floating)) for x in flat):
        return dt.DEFAULT_FLOAT
    if any(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in flat):
        return dt.DEFAULT_INT
    return dt.BOOL if flat.size else dt.DEFAULT_FLOAT


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, scalars, arrays, DLPack objects),
    on `device` ("cpu", "cuda"; by default where `data` is)."""
    if isinstance(data, (list, tuple, bool, int, float)) and not isinstance(data, np.generic):
        target = dt.to_dtype(dtype) if dtype is not None else _infer_python_dtype(data)
        array = np.array(data, dtype=target.np)
    else:
        source = as_tensor(data)
        if source._data is None:
            raise TypeError("tc.tensor() cannot copy a traced tensor; it is already a tensor")
        if device is None and source.is_cuda:
            device = source.device
        array = np.array(source._concrete("tc.tensor()"), dtype=dt.to_dtype(dtype).np if dtype is not None else None)
    t = Tensor.from_numpy(array)
    if requires_grad:
        if not t.dtype.is_floating_point:
            raise TypeError(f"only floating point tensors can require gradients, got {t.dtype.label}")
        t.requires_grad = True
    # (Tensor.to is bound from ops.yaml when the package loads; it moves between devices)
    device = device if device is not None else default_device()
    return t if device is None else t.to(device).detach().requires_grad_(t.requires_grad)
