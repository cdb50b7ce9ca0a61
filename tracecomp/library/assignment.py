"""`tensor[index] = value`: item assignment, functionalized.

Tensors are values in the IR, so an assignment computes the updated tensor with ops and the
tensor object then takes that result over (eagerly its array, in a trace its IR value, and
its autograd history):
- the elements to write are the same index applied to arange(numel) shaped like the tensor,
  so every index form getitem accepts works, and is checked as a read checks it (ints,
  slices, None, ..., integer tensors and lists, masks), and one `scatter` writes `value`
  there (its extra leading size-1 dims dropped, broadcast to the indexed shape, cast to the
  tensor's dtype, as PyTorch does); of repeated positions the last write wins;
- autograd: the updated tensor's grad_fn is the scatter's (the overwritten elements get no
  gradient, `value` gets theirs); assigning into a leaf that requires grad raises, as in
  PyTorch; each assignment bumps the tensor's version, and a backward that saved the old
  value raises PyTorch's error instead of using the new one;
- views: tracecomp's view ops return new tensors.  One made by basic indexing remembers its
  base, index and the base's version, so an assignment into it (`x[0][1] = v`,
  `y = x[1:]; y += 1`) is written back into the base as well, as in PyTorch.  Once the base
  changes otherwise, such a view holds old values where PyTorch's would see the new ones:
  using it then raises (check_fresh, run for every op's tensor arguments) rather than
  silently differ.  Other views (reshape, transpose, ...) cannot reach their base, so
  assigning into one raises;
- in-place operators (`x += y`, `x[1:] *= 2`) are the same: compute, cast to x's dtype
  (refusing a cast PyTorch refuses, such as float into int), take over.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes as dt
from ..core.errors import ArgumentError, ShapeError, TraceError, add_location
from ..core.locations import user_location
from ..dispatch import api as tc
from ..dispatch.batching import take_over_batch
from ..tensors.tensor import check_fresh


def _check_writable(t, what: str) -> None:
    check_fresh(t)
    from ..autograd.grad_mode import is_grad_enabled
    from ..autograd.node import AutogradError
    if t._is_view and t._view_of is None:
        raise ArgumentError(
            f"{what} into the result of a view op (reshape, transpose, ...): in tracecomp that result "
            "is a new tensor, so the change would not reach the tensor it came from, as it does in "
            "PyTorch. Index the original instead (x[0, 1] = v), or call .clone() first if a separate "
            "copy is what you want")
    if t.requires_grad and t.grad_fn is None and is_grad_enabled():
        raise AutogradError(f"a leaf tensor that requires grad is being used in an in-place operation "
                            f"({what}); wrap it in tc.no_grad() or change a clone")


def update(t, updated, what: str) -> None:
    """t becomes `updated`; a view made by indexing writes it back into its base first."""
    _check_writable(t, what)
    if updated._batch is not None or t._batch is not None:
        take_over_batch(t, updated)         # (vmap's state: a batched value needs a batched tensor)
    t._take_over(updated)
    if t._view_of is not None:
        base, index, _ = t._view_of
        setitem(base, index, updated)
        t._view_of = (base, index, base._version)


def inplace(t, result, what: str):
    """The end of `t op= other`: result cast to t's dtype (as PyTorch, never from float to an
    integer or from a number to bool), then taken over."""
    from ..core.errors import DTypeError
    if result.dtype != t.dtype:
        if result.dtype.category > t.dtype.category:      # bool < integers < floats
            raise DTypeError(f"{what}: the result type {result.dtype.label} can't be cast to the "
                             f"tensor's dtype {t.dtype.label} in place")
        result = result.to(t.dtype)
    if tuple(result.shape) != tuple(t.shape):
        raise ShapeError(f"{what}: the result's shape {tuple(result.shape)} is not the tensor's shape "
                         f"{tuple(t.shape)} (an in-place operation cannot broadcast its target)")
    update(t, result, what)
    return t


def setitem(t, index, value) -> None:
    from ..tensors.tensor import Tensor
    _check_writable(t, "item assignment")
    if isinstance(value, Tensor) and value._view_of == (t, index, t._version) and value._view_of[1] is index:
        return      # `t[index] op= v`: the view wrote itself back already; Python then assigns it
    if isinstance(value, Tensor):
        value = value.to(t.dtype)
    elif isinstance(value, (list, tuple, np.ndarray)):
        value = tc.tensor(np.asarray(value)).to(t.dtype)
    else:
        value = tc.full([], value, dtype=t.dtype)
    update(t, put(t, index, value, drop_leading_ones=True), "item assignment")


def put(t, index, values, accumulate: bool = False, drop_leading_ones: bool = False):
    """t with values (already of t's dtype) written at t[index], or added there (repeated
    positions add up).  One scatter into the positions t[index] reads, found by applying
    the same index to arange(numel) shaped like t, which checks the index as a read does
    (masks of the wrong shape raise PyTorch's IndexError); a mask whose every pick gets the
    same value is a `where` instead, whose shape does not depend on the mask's values, so it
    traces (`x[x < 0] = 0`).  drop_leading_ones: values may have more dims than t[index]
    if the extra leading ones have size 1 (item assignment allows it, index_put does not)."""
    masked = _masked_values(t, index, values)
    if masked is not None:
        mask, values = masked
        return t + tc.where(mask, values, 0) if accumulate else tc.where(mask, values, t)
    at = tc.arange(t.numel(), dtype=tc.int64).reshape(list(t.shape))[index]
    if drop_leading_ones:
        values = _without_leading_ones(values, at.ndim)
    src = _broadcast_value(values, list(at.shape)).reshape([-1])
    write = tc.scatter_add if accumulate else tc.scatter
    return write(t.reshape([-1]), 0, at.reshape([-1]), src).reshape(list(t.shape))


def _without_leading_ones(values, ndim: int):
    """values less the leading size-1 dims that it has beyond ndim."""
    drop = 0
    while values.ndim - drop > ndim and values.shape[drop] == 1:
        drop += 1
    return values.reshape(list(values.shape[drop:])) if drop else values


def _broadcast_value(values, shape: list):
    try:
        return tc.broadcast_to(values, shape)
    except ShapeError:
        if any(not isinstance(d, int) for d in shape):      # (tracing: a mask's count of elements)
            raise add_location(TraceError(
                f"x[mask] = values: the value tensor of shape {list(values.shape)} cannot be broadcast to "
                f"the indexing result of shape {list(shape)}, whose size depends on the mask's values "
                "under tc.trace; assign a scalar, or keep the shape: tc.where(mask, values, x)"),
                str(user_location())) from None
        raise ShapeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast "
                         f"to indexing result of shape {list(shape)}") from None


def _masked_values(t, index, values):
    """For `t[mask] = values` with a bool mask over t's leading dims and values that do not
    vary from one picked element to the next: the mask shaped to broadcast against t, and
    values shaped to broadcast against one picked element.  None for any other index (a
    mask of the wrong shape among them: the read then raises PyTorch's IndexError)."""
    from .indexing import entries
    index = entries(index)
    mask = index[0] if len(index) == 1 else None
    if not (mask is not None and getattr(mask, "dtype", None) is dt.BOOL
            and tuple(mask.shape) == tuple(t.shape[:mask.ndim])):
        return None
    rest = list(t.shape[mask.ndim:])
    if values.ndim > len(rest):
        if values.ndim > len(rest) + 1 or values.shape[0] != 1:
            return None         # one value per pick: their number is the mask's count
        values = values.reshape(list(values.shape[1:]))
    if any(v != 1 and v != r for v, r in zip(reversed(values.shape), reversed(rest))):
        return None             # the scatter raises PyTorch's shape mismatch, naming the picks
    return mask.reshape(list(mask.shape) + [1] * len(rest)), values
