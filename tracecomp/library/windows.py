"""The window layers' building blocks as programs over ops: padding after, windows as rows,
and the batch attention's inputs broadcast to (their arithmetic is ops/windows.py)."""
from __future__ import annotations

from ..ops import windows as shapes
from ..ops.rules import broadcast_shapes
from ..dispatch import api as tc


def padded_after(x, extra, value=0):
    """x with extra[i] elements of `value` after each of its last len(extra) dims: one
    constant_pad_nd (it inlines into its reader; its gradient crops)."""
    if not any(extra):
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


def attention_batch(q, k, v) -> list[list[int]]:
    """The shapes query, key and value take when their batch dims broadcast to one batch."""
    batch = broadcast_shapes("scaled_dot_product_attention",
                             [("query", tuple(q.shape)[:-2]), ("key", tuple(k.shape)[:-2]), ("value", tuple(v.shape)[:-2])])
    return [list(batch) + list(t.shape)[-2:] for t in (q, k, v)]


HELPERS = {
    **shapes.HELPERS,
    "attention_batch": attention_batch, "padded_after": padded_after, "window_rows": window_rows,
}
