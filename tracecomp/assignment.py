"""`tensor[index] = value`: item assignment, functionalized.

Tensors are values in the IR, so an assignment computes the updated tensor with ops and the
tensor object then takes that result over (eagerly its array, in a trace its IR value, and
its autograd history):
- the elements to write are the same index applied to arange(numel) shaped like the tensor,
  so every index form getitem accepts works (ints, slices, None, ..., integer tensors, and
  masks eagerly), and one `scatter` writes `value` there (broadcast to the indexed shape,
  cast to the tensor's dtype, as PyTorch does); of repeated positions the last write wins;
- autograd: the updated tensor's grad_fn is the scatter's (the overwritten elements get no
  gradient, `value` gets theirs); assigning into a leaf that requires grad raises, as in
  PyTorch; each assignment bumps the tensor's version, and a backward that saved the old
  value raises PyTorch's error instead of using the new one;
- views: tracecomp's view ops (indexing, reshape, transpose, ...) return new tensors, so an
  assignment into one could not reach its base.  Rather than silently differ from PyTorch,
  assigning into a tensor a view op made raises and says what to write instead.
"""
from __future__ import annotations

import numpy as np

from .errors import ArgumentError


def setitem(t, index, value) -> None:
    import tracecomp as tc
    from .autograd.grad_mode import is_grad_enabled
    from .autograd.node import AutogradError
    from .tensor import Tensor
    if t._is_view:
        raise ArgumentError(
            "item assignment into the result of a view op (indexing, reshape, transpose, ...): in "
            "tracecomp that result is a new tensor, so the assignment would not reach the tensor it "
            "came from, as it does in PyTorch. Index the original in one go (x[0, 1] = v, not "
            "x[0][1] = v), or call .clone() first if a separate copy is what you want")
    if t.requires_grad and t.grad_fn is None and is_grad_enabled():
        raise AutogradError("a leaf tensor that requires grad is being used in an in-place operation "
                            "(item assignment); wrap it in tc.no_grad() or assign into a clone")
    positions = tc.arange(t.numel(), dtype=tc.int64).reshape(list(t.shape))[index]
    if isinstance(value, Tensor):
        value = value.to(t.dtype)
    elif isinstance(value, (list, tuple, np.ndarray)):
        value = tc.tensor(np.asarray(value)).to(t.dtype)
    else:
        value = tc.full([], value, dtype=t.dtype)
    value = tc.broadcast_to(value, list(positions.shape))
    flat = tc.reshape(t, [-1])
    updated = tc.scatter(flat, 0, positions.reshape([-1]), value.reshape([-1])).reshape(list(t.shape))
    t._take_over(updated)
