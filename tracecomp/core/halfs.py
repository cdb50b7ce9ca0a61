"""float32 -> bfloat16 / float16 rounding on NumPy arrays, as bits: the one definition the
eager kernels and the loop-IR interpreter use, and that lower/llvm/halfs.py emits.

Round to nearest, ties to even; overflow gives infinity; float16's subnormals are kept
(no flush to zero).  A NaN stays a NaN of the same sign, made quiet, with the top bits
of its payload, as the x86 conversion instructions (vcvtneps2bf16, vcvtps2ph) give it.
Widening back to float32 is exact; a float16 signaling NaN comes back quiet, as
vcvtph2ps (and so PyTorch) gives it, where NumPy's astype keeps it signaling.
"""
from __future__ import annotations

import numpy as np

_F16_OVERFLOW = np.uint32(143 << 23)      # 2^16: at and past it every float16 is infinite
_F16_NORMAL = np.uint32(113 << 23)        # 2^-14: below it a float16 is subnormal
_HALF_BITS = np.float32(0.5).view(np.uint32)


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 `x`."""
    u = np.asarray(x, np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16
    quiet_nan = (u >> 16) | np.uint32(0x40)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def float16_bits(x: np.ndarray) -> np.ndarray:
    """The float16 bits (uint16) of float32 `x`."""
    u = np.asarray(x, np.float32).view(np.uint32)
    sign = (u >> 16) & np.uint32(0x8000)
    magnitude = u & np.uint32(0x7FFFFFFF)
    # subnormal results: adding 0.5 lines the float16 ulp (2^-24) up with float32's last
    # bit, and float32's own addition rounds to nearest even
    subnormal = (magnitude.view(np.float32) + np.float32(0.5)).view(np.uint32) - _HALF_BITS
    odd = (magnitude >> 13) & 1
    normal = (magnitude - np.uint32(112 << 23) + np.uint32(0xFFF) + odd) >> 13
    nan = np.uint32(0x7E00) | ((magnitude >> 13) & np.uint32(0x3FF))
    bits = np.where(magnitude < _F16_NORMAL, subnormal, normal)
    bits = np.where(magnitude >= _F16_OVERFLOW, np.uint32(0x7C00), bits)
    bits = np.where(magnitude > np.uint32(0x7F800000), nan, bits)
    return (bits | sign).astype(np.uint16)


def widen(x: np.ndarray) -> np.ndarray:
    """float32 of a bfloat16 or float16 array (see the module docstring for NaN)."""
    wide = x.astype(np.float32)
    if x.dtype == np.float16:
        bits = wide.view(np.uint32)
        bits |= np.where(np.isnan(wide), np.uint32(0x00400000), np.uint32(0))
    return wide


def round_float32(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """float32 `x` rounded to the half-precision NumPy dtype `to` (ml_dtypes' bfloat16 or
    np.float16)."""
    with np.errstate(over="ignore", invalid="ignore"):
        bits = bfloat16_bits(x) if np.dtype(to) != np.float16 else float16_bits(x)
    return np.asarray(bits).view(to)      # (a ufunc on 0-d arrays gives a NumPy scalar)
