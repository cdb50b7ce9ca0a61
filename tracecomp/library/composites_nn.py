"""Helpers of the composite programs of the normalization layers, embedding and dropout
(ops.yaml, issue 12): argument checks with PyTorch's messages, and the one in-place write
those programs make (`write_into`: running statistics, dropout(inplace=True)).

Like the helpers in composites.py, each is a small function of Python values (shapes,
dims) or, for `write_into`, of tensors; composites.HELPERS includes `HELPERS` below.
"""
from __future__ import annotations

import math

from ..core import dtypes as dt
from .assignment import update
from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..core.symbolic import is_dynamic
from ..dispatch import api as tc


def _channel_count(name: str, x, **per_channel) -> int:
    """C, the size of dim 1 of an (N, C, ...) input (0 for an empty 1-D one, as PyTorch),
    after checking that each per-channel tensor given holds C values."""
    if x.ndim < 2 and x.numel() > 0:
        raise ShapeError(f"{name}: expects an input of shape (N, C, ...), got shape {tuple(x.shape)}")
    c = x.shape[1] if x.ndim > 1 else 0
    for what, t in per_channel.items():
        if t is not None and t.numel() != c:
            raise ShapeError(f"{name}: {what} should contain {c} elements not {t.numel()} "
                             f"(input shape {tuple(x.shape)})")
    return c


def _stats_count(name: str, x, dims, what: str) -> int:
    """How many values each batch statistic is taken over.  PyTorch refuses 1 in training:
    the variance would be 0 and the running variance's n - 1 zero."""
    n = math.prod(x.shape[d] for d in dims)
    if n == 1:
        raise ShapeError(f"{name}: Expected more than 1 {what} when training, got input size {tuple(x.shape)}")
    return n


def _unbiased_momentum(momentum: float, n):
    """momentum * n / (n - 1), the running variance's factor for a statistic over n values: a
    float, or for a count of dynamic sizes (known at run time) a 0-d float64 tensor."""
    if not is_dynamic(n):
        return momentum * n / (n - 1)
    return tc.full([], n, dtype=dt.FLOAT64) * momentum / (n - 1)


def _both_or_neither(name: str, mean, var) -> bool:
    if (mean is None) != (var is None):
        raise ArgumentError(f"{name}: running_mean and running_var must either both be None or neither be None")
    return mean is not None


def _needs_running_stats(name: str, when: str):
    raise ArgumentError(f"{name}: running_mean and running_var must be given {when}")


def _group_shape(x, groups: int, weight, bias) -> list[int]:
    """x's shape with its channels split into groups: (N, groups, C / groups, ...), after
    group_norm's checks (C divisible by num_groups, C weights and biases)."""
    if x.ndim < 2:
        raise ShapeError(f"group_norm: Expected at least 2 dimensions for input tensor but received {x.ndim}")
    c = x.shape[1]
    if groups <= 0 or c % groups:
        raise ShapeError(f"group_norm: Expected number of channels in input to be divisible by num_groups, "
                         f"but got input of shape {tuple(x.shape)} and num_groups={groups}")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.ndim != 1 or t.numel() != c):
            raise ShapeError(f"group_norm: Expected {what} to be a vector of size equal to the number of "
                             f"channels in input, but got {what} of shape {tuple(t.shape)} and input of "
                             f"shape {tuple(x.shape)}")
    return [x.shape[0], groups, c // groups] + list(x.shape[2:])


def _channel_shape(x) -> list[int]:
    """A (C,) vector shaped to broadcast along dim 1 of x."""
    return [x.shape[1]] + [1] * (x.ndim - 2)


def _rms_eps(x, eps):
    """rms_norm's eps: the machine epsilon of x's dtype when None (PyTorch's default)."""
    if not x.dtype.is_floating_point:
        raise DTypeError(f"rms_norm: expects a floating-point input, got {x.dtype.label}")
    if eps is not None:
        return eps
    return 2.0 ** -23 if x.dtype is dt.FLOAT32 else 2.0 ** -52


def _same_shape(name: str, weight, normalized_shape) -> bool:
    if weight is not None and tuple(weight.shape) != tuple(normalized_shape):
        raise ShapeError(f"{name}: Expected weight to be of same shape as normalized_shape, but got weight "
                         f"of shape {tuple(weight.shape)} and normalized_shape = {tuple(normalized_shape)}")
    return True


def _embedding_rows(indices, weight, padding_idx, max_norm, scale_grad_by_freq: bool, sparse: bool):
    """embedding's checks; returns padding_idx counted from the front (None stays None)."""
    if weight.ndim != 2:
        raise ShapeError(f"embedding: 'weight' must be 2-D, got shape {tuple(weight.shape)}")
    if indices.dtype not in (dt.INT32, dt.INT64):
        raise DTypeError(f"embedding: expects the indices ('input') to be int64 or int32, got {indices.dtype.label}")
    for given, what in ((max_norm is not None, "max_norm (it renormalizes weight's rows in place)"),
                        (scale_grad_by_freq, "scale_grad_by_freq=True"),
                        (sparse, "sparse=True (tracecomp has no sparse gradients)")):
        if given:
            raise ArgumentError(f"embedding: {what} is not supported")
    if padding_idx is None:
        return None
    n = weight.shape[0]
    if not -n <= padding_idx < n:
        raise ShapeError(f"embedding: Padding_idx must be within num_embeddings: padding_idx {padding_idx}, "
                         f"weight of shape {tuple(weight.shape)}")
    return padding_idx % n


def _dropout_p(p: float) -> float:
    if not 0 <= p <= 1:
        raise ArgumentError(f"dropout: dropout probability has to be between 0 and 1, but got {p}")
    return p


def write_into(t, value, what: str):
    """t takes `value` (cast to t's dtype) over in place, as PyTorch's op changes its
    argument; returns t.  Eagerly t's array changes; inside tc.trace t's traced value does
    (the tracer runs such a composite inline) and the trace writes it back to the caller."""
    update(t, value if value.dtype == t.dtype else value.to(t.dtype), what)
    return t


HELPERS = {
    "channel_count": _channel_count, "stats_count": _stats_count, "both_or_neither": _both_or_neither,
    "needs_running_stats": _needs_running_stats, "group_shape": _group_shape, "channel_shape": _channel_shape,
    "unbiased_momentum": _unbiased_momentum,
    "rms_eps": _rms_eps, "same_shape": _same_shape, "embedding_rows": _embedding_rows, "dropout_p": _dropout_p,
    "write_into": write_into,
}
