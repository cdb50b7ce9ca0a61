"""interpolate's source positions and weights as tensors, for an input or output size known
only at run time (a dynamic size, symbolic.Dim): the same formulas as resampling.py's NumPy
ones (PyTorch's CPU kernel: float32 scales, the input's precision for linear weights), as
index arithmetic on aranges, so one compile serves every size.

An output size from a float scale_factor, floor(n * scale) in double as PyTorch, is a size
expression where the scale is a dyadic fraction (1.5, 0.75, 2.0: n * scale is exact in
double, so it is floor(n * p / 2^k)); any other scale (1.4) needs the size as a number, and
tc.trace compiles that size specialized (PyTorch guards on it too).
"""
from __future__ import annotations

from fractions import Fraction

from ..core import dtypes as dt
from ..core.symbolic import DynamicShapeError
from ..dispatch import api as tc


def scaled_size(n, scale: float):
    """floor(n * scale) for a dynamic n (see the module docstring)."""
    exact = Fraction(scale)
    if exact.denominator & (exact.denominator - 1) == 0 and exact.denominator <= 2 ** 20:
        return (n * exact.numerator) // exact.denominator
    try:
        return int(n)           # a number: tc.trace then compiles this size specialized
    except DynamicShapeError as e:
        raise DynamicShapeError(f"interpolate: scale_factor={scale} is no dyadic fraction, so the output "
                                f"size floor({n} * {scale}) needs the dynamic size {n} as a number") from e


def _inverse_scale(n_in, n_out, scale, dtype):
    """PyTorch's compute_scales_value as a 0-d tensor: 1 / scale_factor when one was given,
    else n_in / n_out, in `dtype`."""
    if scale is not None and scale > 0:
        return tc.full([], float(dtype.np.type(1.0 / scale)), dtype=dtype)
    return tc.full([], n_in, dtype=dtype) / tc.full([], n_out, dtype=dtype)


def _at_most(v, top):
    return tc.where(v < top, v, top)


def nearest_positions(n_in, n_out, scale, exact: bool):
    """The input position of each output position (int64), as resampling.nearest_positions."""
    i = tc.arange(n_out)
    s = _inverse_scale(n_in, n_out, scale, dt.FLOAT32)
    src = tc.floor((i.to(dt.FLOAT64) + 0.5) * s.to(dt.FLOAT64)) if exact else tc.floor(i.to(dt.FLOAT32) * s)
    return _at_most(src.to(dt.INT64), n_in - 1)


def linear_weights(n_in, n_out, scale, align_corners: bool, dtype):
    """(first position, second position, second one's weight), as resampling.linear_weights."""
    i = tc.arange(n_out).to(dtype)
    if align_corners:
        s = tc.full([], n_in - 1, dtype=dtype) / tc.full([], n_out - 1, dtype=dtype)
        s = tc.where(tc.full([], n_out, dtype=dt.INT64) > 1, s, tc.zeros([], dtype=dtype))
        src = s * i
    else:
        s = _inverse_scale(n_in, n_out, scale, dtype)
        src = tc.clamp(s * (i + 0.5) - 0.5, min=0)
    i0 = _at_most(tc.floor(src).to(dt.INT64), n_in - 1)
    w1 = tc.clamp(src - i0.to(dtype), 0, 1)
    return i0, _at_most(i0 + 1, n_in - 1), w1

