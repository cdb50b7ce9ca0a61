"""`tensor[index]`: Python's index syntax rewritten into table ops, as PyTorch does it.

Basic indexing (ints, slices with positive steps and negative bounds, None, Ellipsis)
becomes select/slice/unsqueeze, like PyTorch's applySlicing: ints are selects, applied
first.  What remains are the advanced indices, integer tensors (or lists, or arrays) at
some dims of the result so far:
- they broadcast together to a shape B;
- the indexed dims move to the front, and the first index picks rows with one
  `index_select`; each further index picks, from the row the previous ones chose, with a
  `gather` along the next dim.  So every index tensor reaches an op of its own, which
  bounds-checks it (eagerly, and in compiled code for function inputs); negative values
  count from the end (composites' `wrapped` pattern, which the compiled check allows);
- the result is B followed by the other dims, or, when the indexed dims were adjacent,
  B in their place (NumPy's rule, which PyTorch follows).
A bool tensor (a mask) over k dims stands for the k index tensors of its nonzero
positions: eager only, as the number of them is the result's shape (tc.trace raises a
TraceError that says how to keep the shape static).  Everything traces, differentiates
(index_select and gather have gradients) and compiles like any other op.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ArgumentError, ShapeError


class _ZeroDimMask:
    """A 0-d bool index: a new dim of size 1 (True) or 0 (False)."""
    def __init__(self, keep: bool):
        self.keep = keep


def _expand_ellipsis(index: tuple, ndim: int) -> tuple:
    consuming = sum(1 for i in index if i is not None and i is not Ellipsis and not isinstance(i, _ZeroDimMask))
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


def _as_tensor_index(i):
    """Lists and arrays become tensors; tensors stay; anything else is returned as is."""
    import tracecomp as tc
    from .tensor import Tensor
    if isinstance(i, (list, np.ndarray)):
        a = np.asarray(i)
        if a.dtype.kind not in "biu":
            raise ArgumentError(f"tensors used as indices must be integer or bool, got {a.dtype} from {i!r}")
        return tc.tensor(a.astype(np.int64) if a.dtype.kind in "iu" else a)
    if isinstance(i, Tensor) and i.dtype.is_floating_point:
        raise ArgumentError(f"tensors used as indices must be integer or bool, got {i.dtype.label}")
    return i


def _masks_to_indices(index: tuple) -> tuple:
    """A bool tensor over k dims becomes the k index tensors of its nonzero positions."""
    import tracecomp as tc
    from .composites import values_for
    from .tensor import Tensor
    out = []
    for i in index:
        if isinstance(i, Tensor) and i.dtype is tc.bool:
            rows = np.argwhere(values_for("x[mask]", i)).astype(np.int64)
            if i.ndim == 0:
                out.append(_ZeroDimMask(bool(rows.shape[0])))
            else:
                out.extend(tc.tensor(rows[:, k].copy()) for k in range(i.ndim))
        else:
            out.append(i)
    return tuple(out)


def getitem(t, index):
    import tracecomp as tc
    from .tensor import Tensor
    base, original = t, index
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (bool, np.bool_)) for i in index):
        raise ArgumentError("indexing with a Python bool is not supported; use None to add a dim")
    index = _masks_to_indices(tuple(_as_tensor_index(i) for i in index))
    index = _expand_ellipsis(index, t.ndim)
    dim, advanced = 0, []
    for i in index:
        if i is None:
            t = tc.unsqueeze(t, dim)
            dim += 1
        elif isinstance(i, slice):
            if i != slice(None):
                step = 1 if i.step is None else i.step
                t = tc.slice(t, dim, i.start, i.stop, step) if step > 0 else _backwards(t, dim, i)
            dim += 1
        elif isinstance(i, Tensor):
            advanced.append((dim, i))
            dim += 1
        elif isinstance(i, _ZeroDimMask):
            t = tc.unsqueeze(t, dim)
            if not i.keep:
                advanced.append((dim, tc.tensor(np.zeros(0, np.int64))))
            dim += 1
        elif isinstance(i, (int, np.integer)):
            t = tc.select(t, dim, int(i))
        else:
            raise ArgumentError(f"unsupported index {i!r} of type {type(i).__name__}: use ints, "
                                "slices, None, ..., or integer or bool tensors")
    if not advanced:
        if t is not base:
            t._view_of = (base, original, base._version)    # writes into it reach base (assignment.py)
        return t
    out = _advanced(t, advanced)
    out._is_view = False          # advanced indexing copies, in PyTorch too
    return out


def _backwards(t, dim: int, i: slice):
    """`t[a:b:-s]` along dim, as NumPy and JAX read it (PyTorch refuses negative steps): the
    dim flipped, then a forward slice of the same elements."""
    import tracecomp as tc
    n = t.shape[dim]
    if i.step == 0:
        raise ShapeError("slice step cannot be zero")
    if not isinstance(n, int):
        raise ShapeError(f"a negative slice step needs a static size; dim {dim} has the dynamic size {n}")
    start, stop, step = i.indices(n)
    count = len(range(start, stop, step))
    first = n - 1 - start
    return tc.slice(tc.flip(t, [dim]), dim, first, first + (count - 1) * -step + 1 if count else first, -step)


def _advanced(t, advanced: list):
    import tracecomp as tc
    from .composites import wrapped
    from .ops.rules import broadcast_shapes
    dims = [d for d, _ in advanced]
    shape = list(broadcast_shapes("indexing", [(f"index {k}", i.shape) for k, (_, i) in enumerate(advanced)]))
    n = math.prod(shape)
    flat = [tc.broadcast_to(i, shape).reshape([-1]) for _, i in advanced]
    rest = [d for d in range(t.ndim) if d not in dims]
    y = tc.permute(t, dims + rest) if dims + rest != list(range(t.ndim)) else t
    y = tc.index_select(y, 0, wrapped(flat[0], t.shape[dims[0]]))
    for k in range(1, len(dims)):
        tail = list(y.shape[2:])
        at = wrapped(flat[k], t.shape[dims[k]]).reshape([n, 1] + [1] * len(tail)).expand([n, 1] + tail)
        y = tc.gather(y, 1, at).squeeze(1)
    y = y.reshape(shape + [t.shape[d] for d in rest])
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent and dims[0] > 0 and shape:
        y = tc.movedim(y, list(range(len(shape))), list(range(dims[0], dims[0] + len(shape))))
    return y
