"""Mathematical constants to 50 digits and their splits into sums of machine numbers.

`split(value, fmt, hi_bits)` gives hi + lo where hi keeps only `hi_bits` significant bits,
so that k * hi is exact for small integers k (Cody-Waite style reduction), and lo is the
rest rounded to the format. `parts(value, fmt, n)` gives n non-overlapping full-precision
pieces (value ~= sum of them to about n * precision bits).
"""
from __future__ import annotations

import math
from fractions import Fraction

from .core import Fmt

LN2 = Fraction("0.69314718055994530941723212145817656807550013436026")
PI = Fraction("3.14159265358979323846264338327950288419716939937511")
LOG2E = 1 / LN2
PIO2 = PI / 2
PIO4 = PI / 4
TWO_OVER_PI = 2 / PI


def round_to(v: Fraction, fmt: Fmt) -> float:
    """Round a rational to the nearest number of the format (normal range only)."""
    if v == 0:
        return 0.0
    e = math.floor(math.log2(abs(v)))
    while abs(v) >= Fraction(2) ** (e + 1):
        e += 1
    while abs(v) < Fraction(2) ** e:
        e -= 1
    q = Fraction(2) ** (e - fmt.mant)
    n = v / q
    r = round(n)                      # Python rounds half to even, as IEEE does
    return float(r * q)


def split(v: Fraction, fmt: Fmt, hi_bits: int) -> tuple[float, float]:
    """hi with hi_bits significant bits (truncated toward zero) and lo = round(v - hi)."""
    e = math.floor(math.log2(abs(v)))
    q = Fraction(2) ** (e - hi_bits + 1)
    hi = Fraction(math.trunc(v / q)) * q
    return float(hi), round_to(v - hi, fmt)


def parts(v: Fraction, fmt: Fmt, n: int) -> list[float]:
    """n pieces, each the format-rounded remainder of the previous ones."""
    out = []
    for _ in range(n):
        p = round_to(v, fmt)
        out.append(p)
        v -= Fraction(p)
    return out


def two_over_pi_bits(nbits: int) -> int:
    """floor(2/pi * 2**nbits), exactly, from Machin's formula in integer arithmetic."""
    guard = nbits + 64
    one = 1 << guard

    def arctan_inv(x: int) -> int:           # arctan(1/x) * 2**guard
        total, term, k, x2 = 0, one // x, 1, x * x
        while term:
            total += term // k if (k // 2) % 2 == 0 else -(term // k)
            term //= x2
            k += 2
        return total

    pi = 4 * (4 * arctan_inv(5) - arctan_inv(239))   # pi * 2**guard, error a few units
    return (2 * one << nbits) // pi
