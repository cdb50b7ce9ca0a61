"""Shape plans for the layers of ops.yaml: sliding windows (convolution, pooling), attention.

The layers themselves are composite programs (library/windows.py and library/composites*.py);
these helpers do their arithmetic on Python ints and raise PyTorch's errors, naming the
layer, before any op runs.  Spatial dims are the last two (a 1-D layer adds a dim of 1).
They live in ops/ because the table's shape rules (im2col's) share them.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes as dt
from ..core.errors import ArgumentError, DTypeError, ShapeError


def _shape(x) -> tuple[int, ...]:
    return tuple(x.shape)


def layer_input(name: str, x, spatial: int = 2) -> bool:
    """Whether x is batched ((N, C, *spatial)) rather than one sample ((C, *spatial))."""
    if x.ndim not in (spatial + 1, spatial + 2):
        raise ShapeError(f"{name}: expected a {spatial + 1}-D (unbatched) or {spatial + 2}-D (batched) "
                         f"input, got shape {_shape(x)}")
    if x.dtype.label == "bool":
        raise DTypeError(f"{name}: expects a numeric input, got bool")
    if 0 in _shape(x)[-spatial - 1:]:
        raise ShapeError(f"{name}: the input's channels and spatial dims must be nonzero, got shape {_shape(x)}")
    return x.ndim == spatial + 2


def conv_input(name: str, x, weight, bias, groups: int, spatial: int = 2, transposed: bool = False) -> bool:
    """layer_input, plus PyTorch's checks of a convolution's weight, bias and groups."""
    batched = layer_input(name, x, spatial)
    shape = _shape(x) if batched else (1,) + _shape(x)
    if weight.ndim != spatial + 2:
        raise ShapeError(f"{name}: the weight must be {spatial + 2}-D, got weight {_shape(weight)} for "
                         f"input {_shape(x)}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        got = ", ".join(f"{n} {t.dtype.label}" for n, t in (("input", x), ("weight", weight), ("bias", bias))
                        if t is not None)
        raise DTypeError(f"{name}: input, weight and bias must have the same dtype, got {got}")
    if isinstance(groups, bool) or groups < 1:
        raise ArgumentError(f"{name}: groups must be a positive int, got {groups!r}")
    if 0 in _shape(weight):
        raise ShapeError(f"{name}: the weight has an empty dim: {_shape(weight)}")
    c = shape[1]
    out = weight.shape[1] * groups if transposed else weight.shape[0]
    expected = weight.shape[0] if transposed else weight.shape[1] * groups
    if expected != c or (transposed and c % groups) or (not transposed and out % groups):
        role = "in_channels" if transposed else "in_channels / groups"
        raise ShapeError(f"{name}: input {_shape(x)} has {c} channels, but weight {_shape(weight)} with groups="
                         f"{groups} expects {expected} (weight dim {0 if transposed else 1} is {role}; "
                         f"both channel counts must divide by groups)")
    if bias is not None and _shape(bias) != (out,):
        raise ShapeError(f"{name}: bias must have shape ({out},) (one per output channel), got {_shape(bias)}")
    return batched


def _check_window_ints(name: str, dims: int, kernel, dilation, padding, stride) -> None:
    for what, values, least in (("kernel_size", kernel, 1), ("dilation", dilation, 1),
                                ("padding", padding, 0), ("stride", stride, 1)):
        if len(values) != dims or any(v < least for v in values):
            raise ArgumentError(f"{name}: {what} must be {dims} ints of at least {least}, got {tuple(values)}")


def windows(name: str, spatial, kernel, dilation, padding, stride, ceil_mode: bool = False) -> list[int]:
    """Window positions per spatial dim: (size + 2p - d(k-1) - 1) / s + 1, rounded down (or up
    with ceil_mode, keeping the last window starting inside the input or its left padding)."""
    _check_window_ints(name, len(spatial), kernel, dilation, padding, stride)
    counts = []
    for size, k, d, p, s in zip(spatial, kernel, dilation, padding, stride):
        reach = size + 2 * p - d * (k - 1) - 1
        n = (reach + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (n - 1) * s >= size + p:
            n -= 1
        if reach < 0 or n < 1:
            raise ShapeError(f"{name}: the kernel {tuple(kernel)} (dilation {tuple(dilation)}) is larger than "
                             f"the input's spatial size {tuple(spatial)} padded by {tuple(padding)}")
        counts.append(n)
    return counts


def named_padding(name: str, padding: str, weight, stride, dilation) -> tuple[list[int], list[int]]:
    """(padding on both sides, extra padding after) per spatial dim: "same" pads the total
    d(k-1), the odd element after, as PyTorch (stride 1 only); "valid" is no padding."""
    kernel = _shape(weight)[2:]
    if padding == "valid":
        return [0] * len(kernel), [0] * len(kernel)
    if padding != "same":
        raise ArgumentError(f"{name}: padding must be 'same', 'valid' or ints, got {padding!r}")
    if any(s != 1 for s in stride):
        raise ArgumentError(f"{name}: padding='same' is not supported for strided convolutions (stride "
                            f"{tuple(stride)}), as in PyTorch")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [t // 2 for t in totals], [t - 2 * (t // 2) for t in totals]


def transposed_size(name: str, spatial, kernel, dilation, padding, stride, output_padding) -> list[int]:
    """conv_transpose's output size: (size - 1)s - 2p + d(k-1) + output_padding + 1."""
    _check_window_ints(name, len(spatial), kernel, dilation, padding, stride)
    out = []
    for size, k, d, p, s, op in zip(spatial, kernel, dilation, padding, stride, output_padding):
        if not 0 <= op < max(s, d):
            raise ArgumentError(f"{name}: output_padding {tuple(output_padding)} must be smaller than the "
                                f"stride {tuple(stride)} or the dilation {tuple(dilation)}")
        n = (size - 1) * s - 2 * p + d * (k - 1) + op + 1
        if n < 1:
            raise ShapeError(f"{name}: the output size would be {n} for input size {size}, kernel {k} and "
                             f"padding {p}")
        out.append(n)
    return out


def pool_plan(name: str, x, kernel, stride, padding, dilation, ceil_mode: bool):
    """(stride, window counts, extra rows/cols past the padded input that ceil_mode's last
    windows reach) with PyTorch's pooling checks; stride None or [] means the kernel size."""
    stride = list(kernel) if not stride else list(stride)
    for k, d, p in zip(kernel, dilation, padding):
        if 2 * p > d * (k - 1) + 1:
            raise ArgumentError(f"{name}: padding {tuple(padding)} must be at most half of the kernel "
                                f"{tuple(kernel)}" + (f" dilated by {tuple(dilation)}" if any(dd != 1 for dd in dilation) else ""))
    spatial = _shape(x)[-2:]
    counts = windows(name, spatial, kernel, dilation, padding, stride, ceil_mode)
    extra = [max(0, (n - 1) * s + d * (k - 1) + 1 - (size + 2 * p)) if ceil_mode else 0     # (else 0: a
             for n, s, d, k, size, p in zip(counts, stride, dilation, kernel, spatial, padding)]    # floor's guard)
    return stride, counts, extra


def attention_shapes(q, k, v, mask, is_causal: bool, enable_gqa: bool) -> tuple[int, int]:
    """(the query's feature size, how many query heads share a key/value head), with
    PyTorch's checks of scaled_dot_product_attention's shapes."""
    name = "scaled_dot_product_attention"
    shapes = f"query {_shape(q)}, key {_shape(k)}, value {_shape(v)}"
    if min(q.ndim, k.ndim, v.ndim) < 2 or not q.dtype.is_floating_point:
        raise ShapeError(f"{name}: expects floating-point tensors of at least 2 dims, got {shapes} ({q.dtype.label})")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"{name}: query, key and value must have the same dtype, got "
                         f"{q.dtype.label}, {k.dtype.label}, {v.dtype.label}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{name}: the query's and key's feature sizes, and the key's and value's lengths, "
                         f"must match: {shapes}")
    heads = 1
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3:
        if q.shape[-3] % k.shape[-3] or k.shape[-3] != v.shape[-3]:
            raise ShapeError(f"{name}: with enable_gqa the query's heads must be a multiple of the key's and "
                             f"value's (equal) heads: {shapes}")
        heads = q.shape[-3] // k.shape[-3]
    if is_causal and mask is not None:
        raise ArgumentError(f"{name}: give attn_mask or is_causal=True, not both")
    return q.shape[-1], heads


def fused_attention(q, mask, dropout_p: float) -> bool:
    """Whether scaled_dot_product_attention runs as the fused op: without dropout (the fused
    kernel has none, as PyTorch's CPU flash kernel) and with no mask, a bool mask or one in
    the query's dtype (another float mask promotes the scores: the composite handles that)."""
    return dropout_p == 0 and (mask is None or mask.dtype in (dt.BOOL, q.dtype))


def sqrt_int(n: int) -> float:
    return float(np.sqrt(n))


HELPERS = {
    "attention_shapes": attention_shapes, "sqrt_int": sqrt_int, "fused_attention": fused_attention,
    "layer_input": layer_input, "conv_input": conv_input, "windows": windows, "named_padding": named_padding,
    "transposed_size": transposed_size, "pool_plan": pool_plan,
}
