"""The windows of adaptive pooling as tensors: output i covers input positions
floor(i * n_in / n_out) up to ceil((i + 1) * n_in / n_out), end excluded (PyTorch's rule).

They are index arithmetic on aranges, so an input size known only at run time (a dynamic
size, symbolic.Dim) is a scalar of that arithmetic, not a shape: one compile serves every
input size.  With static sizes they are constants that the passes fold.
"""
from __future__ import annotations

from ..core.symbolic import is_dynamic
from ..dispatch import api as tc


def window_bounds(n_in, n_out):
    """(start, end) int64 vectors of the n_out windows over n_in positions."""
    i = tc.arange(n_out)
    return (i * n_in) // n_out, ((i + 1) * n_in + n_out - 1) // n_out


def averaging_matrix(n_in, n_out, dtype):
    """(n_out, n_in): row i weighs the positions of window i by 1 / its length."""
    start, end = window_bounds(n_in, n_out)
    j = tc.arange(n_in)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def longest_window(n_in, n_out):
    """The most positions a window covers: exactly for static sizes; for a dynamic one the
    bound ceil(n_in / n_out) + 1 (an output size equal to the input's: 1)."""
    if n_out is n_in:           # (output_size None keeps the input's size)
        return 1
    if not is_dynamic(n_in) and not is_dynamic(n_out):
        return max((-(-(i + 1) * n_in // n_out) - i * n_in // n_out for i in range(n_out)), default=1)
    return (n_in + n_out - 1) // n_out + 1


def window_positions(n_in, n_out):
    """(n_out, longest_window) int64: each window's input positions, short windows padded with
    their first position (a repeat changes no max, and comes after the original, so ties
    keep it)."""
    start, end = window_bounds(n_in, n_out)
    p = start[:, None] + tc.arange(longest_window(n_in, n_out))
    return tc.where(p < end[:, None], p, start[:, None])
