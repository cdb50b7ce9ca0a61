"""`tensor[index]`: Python's index syntax rewritten into select/slice/unsqueeze ops.

Like PyTorch's applySlicing, basic indexing (ints, slices with positive steps and
negative bounds, None, Ellipsis) becomes a chain of table ops, so it traces, differentiates
and compiles like any other op.  Tensor (advanced) indices are refused with a pointer to
index_select and gather.
"""
from __future__ import annotations

import numpy as np

from .errors import ArgumentError, ShapeError


def _expand_ellipsis(index: tuple, ndim: int) -> tuple:
    consuming = sum(1 for i in index if i is not None and i is not Ellipsis)
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise ArgumentError("an index can only have a single ellipsis ('...')")
    if consuming > ndim:
        raise ShapeError(f"too many indices for a tensor of dimension {ndim} ({consuming} given)")
    out = []
    for i in index:
        if i is Ellipsis:
            out.extend([slice(None)] * (ndim - consuming))
        else:
            out.append(i)
    return tuple(out)


def getitem(t, index):
    import tracecomp as tc
    from .tensor import Tensor
    index = index if isinstance(index, tuple) else (index,)
    index = _expand_ellipsis(index, t.ndim)
    dim = 0
    for i in index:
        if i is None:
            t = tc.unsqueeze(t, dim)
            dim += 1
        elif isinstance(i, slice):
            if i != slice(None):
                step = 1 if i.step is None else i.step
                if step <= 0:
                    raise ShapeError(f"slice step must be greater than zero, got {step}")
                t = tc.slice(t, dim, i.start, i.stop, step)
            dim += 1
        elif isinstance(i, (bool, np.bool_)) or isinstance(i, (Tensor, np.ndarray, list)):
            raise ArgumentError(f"indexing with {type(i).__name__} is not supported; use "
                                "tc.index_select(x, dim, index) or tc.gather(x, dim, index)")
        elif isinstance(i, (int, np.integer)):
            t = tc.select(t, dim, int(i))
        else:
            raise ArgumentError(f"unsupported index {i!r} of type {type(i).__name__}: use ints, "
                                "slices, None or ...")
    return t
