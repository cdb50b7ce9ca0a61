"""The window layers' building blocks as programs over ops: padding after, windows as rows,
columns summed back into windows, average pooling's divisors, and the batch attention's
inputs broadcast to (their arithmetic is ops/windows.py)."""
from __future__ import annotations

from ..ops import windows as shapes
from ..core.errors import ArgumentError
from ..core.symbolic import is_dynamic
from ..ops.rules import broadcast_shapes
from ..dispatch import api as tc


def padded_after(x, extra, value=0):
    """x with extra[i] elements of `value` after each of its last len(extra) dims: one
    constant_pad_nd (it inlines into its reader; its gradient crops)."""
    if not any(is_dynamic(e) or e for e in extra):       # (a dynamic amount may be 0: no guard)
        return x
    pad = [p for e in reversed(list(extra)) for p in (0, e)]      # (before, after) from the last dim
    return tc.constant_pad_nd(x, pad, value)


def window_rows(x, kernel, dilation, padding, stride, counts, fill=0):
    """(N, C, kh*kw, windows): each window's values (padding reads `fill`).  Windows that
    tile the input (stride = kernel, no padding or dilation: most pooling) are a view of
    it, reshapes and a permute, so their gradient moves values instead of summing them
    back (col2im); other windows come from im2col."""
    n, c = x.shape[0], x.shape[1]
    (kh, kw), (oh, ow) = kernel, counts
    if tuple(stride) == tuple(kernel) and not any(padding) and all(d == 1 for d in dilation):
        tiles = x[:, :, :oh * kh, :ow * kw].reshape(n, c, oh, kh, ow, kw)
        return tiles.permute(0, 1, 3, 5, 2, 4).reshape(n, c, kh * kw, oh * ow)
    cols = tc.im2col(x, kernel, dilation, padding, stride).reshape(n, c, kh * kw, oh * ow)
    if fill == 0 or not any(padding):
        return cols
    inside = tc.im2col(tc.ones_like(x), kernel, dilation, padding, stride).reshape(n, c, kh * kw, oh * ow) > 0
    return tc.where(inside, cols, fill)


def summed_windows(cols, size, kernel, dilation, padding, stride):
    """col2im: each column of the (N, C*kh*kw, windows) matrix added back into its window of
    an output plane of `size`.  With a dynamic kernel size (col2im's lowering adds the taps
    up one by one), as a sum over the taps of a gather: output row y takes tap ki from window
    (y + p - ki*d) / s where that is a whole window inside the plane (likewise columns)."""
    if not any(is_dynamic(k) for k in kernel):
        return tc.col2im(cols, size, kernel, dilation, padding, stride)
    counts = shapes.windows("conv_transpose2d", size, kernel, dilation, padding, stride)
    windows, valid = [], []
    for n, k, d, p, s, m in zip(size, kernel, dilation, padding, stride, counts):
        t = tc.arange(n)[:, None] + p - tc.arange(k)[None, :] * d        # (n, k): the window's start * s
        valid.append((t % s == 0) & (t >= 0) & (t < m * s))
        windows.append(tc.where(valid[-1], t // s, 0))
    (kh, kw), (oh, ow) = kernel, counts
    # flat position of (tap ki, kj; window oh, ow) in one channel's kh*kw*oh*ow values: (h, w, kh, kw)
    at = ((tc.arange(kh)[None, None, :, None] * kw + tc.arange(kw)[None, None, None, :]) * oh
          + windows[0][:, None, :, None]) * ow + windows[1][None, :, None, :]
    inside = valid[0][:, None, :, None] & valid[1][None, :, None, :]
    n, c = cols.shape[0], cols.shape[1] // (kh * kw)
    flat = cols.reshape(n, c, -1)
    picked = tc.gather(flat, 2, at.reshape(1, 1, -1).expand(n, c, -1)).reshape(n, c, size[0], size[1], kh * kw)
    return tc.where(inside.reshape(size[0], size[1], kh * kw), picked, 0).sum(-1)


def avg_divisors(spatial, kernel, stride, padding, counts, count_include_pad: bool, divisor_override, dtype):
    """(counts) of `dtype`: what avg_pool divides each window's sum by.  PyTorch's rule counts
    the padding inside the padded input (unless count_include_pad=False) but never ceil_mode's
    windows' overhang.  Index arithmetic on aranges: a dynamic input size is a scalar of it."""
    if divisor_override is not None:
        if divisor_override == 0:
            raise ArgumentError("avg_pool2d: divisor_override must not be zero")
        return tc.full(counts, divisor_override, dtype=dtype)
    lengths = []
    for size, k, s, p, n in zip(spatial, kernel, stride, padding, counts):
        start = tc.arange(n) * s - p
        end = tc.where(start + k < size + p, start + k, size + p)
        if count_include_pad:
            lengths.append(end - start)
        else:
            lengths.append(tc.where(end < size, end, size) - tc.where(start > 0, start, 0))
    return (lengths[0][:, None] * lengths[1][None, :]).to(dtype)


def attention_batch(q, k, v) -> list[list[int]]:
    """The shapes query, key and value take when their batch dims broadcast to one batch."""
    batch = broadcast_shapes("scaled_dot_product_attention",
                             [("query", tuple(q.shape)[:-2]), ("key", tuple(k.shape)[:-2]), ("value", tuple(v.shape)[:-2])])
    return [list(batch) + list(t.shape)[-2:] for t in (q, k, v)]


HELPERS = {
    **shapes.HELPERS,
    "attention_batch": attention_batch, "padded_after": padded_after, "window_rows": window_rows,
    "avg_divisors": avg_divisors, "summed_windows": summed_windows,
}
