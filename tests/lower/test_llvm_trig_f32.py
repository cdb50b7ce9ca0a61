"""The float32 sin/cos/tan argument reduction (tracecomp/lower/llvm/math/trig.py): its
bucket constants, and the inputs where it changes hands or is hardest.

Results are compared with numpy's float64 result rounded to float32, in ulps, as in
tests/lower/test_llvm_math.py. The reduction tests allow 1 ulp (sin and cos measure at most 1
over every float32, tan 0): a wrong quadrant or a reduction that lost bits shows up as
many ulps or a wrong sign.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tracecomp.lower.llvm.math.consts import two_over_pi_bits
from tracecomp.lower.llvm.math.trig import F32_BUCKETS, f32_factors
from test_llvm_math import compiled, reference, specials, ulp_errors

TRIG = ["sin", "cos", "tan"]
BOUND = 1.0


def _two_over_pi(nbits: int = 400) -> Fraction:
    return Fraction(two_over_pi_bits(nbits), 1 << nbits)


@pytest.mark.parametrize("lo, s", F32_BUCKETS)
def test_bucket_constants(lo, s):
    """G0 + G1 + G2 is 2^s 2/pi mod 4 (times 2^-s) to ~159 bits; in the buckets above
    2^52 every float32 is a multiple of 2^s and below 2^(s + 51), and G0 2^s >= 1/2."""
    g0, g1, g2 = f32_factors(lo, s)
    total = (Fraction(g0) + Fraction(g1) + Fraction(g2)) * 2 ** s
    want = _two_over_pi() * 2 ** s
    diff = (total - want) % 4
    assert min(diff, 4 - diff) < Fraction(1, 2 ** 150) * max(1, total)
    assert abs(Fraction(g1)) <= Fraction(g0) * 2 ** -52 and abs(Fraction(g2)) <= abs(Fraction(g1)) * 2 ** -52
    if lo:
        assert lo == 2.0 ** (s + 23)                      # least ulp of the bucket is 2^s
        assert Fraction(1, 2) <= Fraction(g0) * 2 ** s < Fraction(9, 2)
        upper = [b for b, _ in F32_BUCKETS if b > lo]
        assert (upper[0] if upper else 2.0 ** 128) <= 2.0 ** (s + 51)


def _near(v: float, count: int) -> np.ndarray:
    """The `count` float32 on each side of v (and v), both signs."""
    c = np.float32(v).view(np.uint32).astype(np.int64)
    x = np.arange(c - count, c + count + 1).astype(np.uint32).view(np.float32)
    return np.concatenate([x, -x])


def _check(name: str, x: np.ndarray, bound: float = BOUND) -> None:
    got = compiled(name, "f32")(x)
    err = ulp_errors(got, reference(name, "f32", x))
    i = int(np.argmax(err))
    assert err[i] <= bound, f"{name}({x[i]!r}) = {got[i]!r}: {err[i]} ulp"


@pytest.mark.parametrize("name", TRIG)
def test_bucket_boundaries(name):
    """Every float32 within 4096 ulps of each switch-over (2^52, 2^80, 2^108), of the
    bucket ends below them and of float32 max, both signs."""
    edges = [lo for lo, _ in F32_BUCKETS[1:]] + [float(np.finfo(np.float32).max), 2.0 ** 23, 2.0 ** 24]
    x = np.concatenate([_near(v, 4096) for v in edges])
    x = x[np.isfinite(x)]
    _check(name, x)


def _closest_to_quadrants(e: int, keep: int) -> np.ndarray:
    """The float32 m 2^(e-23) (m in [2^23, 2^24)) whose x 2/pi lie closest to an integer:
    the fraction of m F, F = 2^(e-23) 2/pi mod 1 as 96 fixed-point bits, in uint64."""
    w = int(_two_over_pi() * 2 ** (e - 23 + 96)) & ((1 << 96) - 1)
    w0, w1, w2 = (np.uint64((w >> k) & 0xFFFFFFFF) for k in (64, 32, 0))
    m = np.arange(1 << 23, 1 << 24, dtype=np.uint64)
    with np.errstate(over="ignore"):
        top = ((m * w0) << np.uint64(32)) + m * w1 + ((m * w2) >> np.uint64(32))   # mod 2^64
    dist = np.minimum(top, np.uint64(0) - top)
    best = np.argpartition(dist, keep)[:keep]
    return (m[best].astype(np.float64) * 2.0 ** (e - 23)).astype(np.float32)


@pytest.mark.parametrize("e", [23, 30, 51, 52, 53, 79, 80, 81, 107, 108, 109, 127])
def test_closest_to_multiples_of_pi_over_2(e):
    """In binades at and around the switch-overs, the 300 float32 closest to a multiple of
    pi/2 (r tiny: the reduction's bits all count)."""
    x = _closest_to_quadrants(e, 300)
    x = np.concatenate([x, -x])
    for name in TRIG:
        _check(name, x)


@pytest.mark.parametrize("name", TRIG)
def test_special_inputs(name):
    """+-0 (sign kept by sin and tan), +-inf and NaN give NaN, subnormals, and a
    log-uniform sample of every binade, both signs."""
    rng = np.random.default_rng(5)
    sub = rng.integers(1, 1 << 23, 2000).astype(np.uint32).view(np.float32)
    wide = (rng.uniform(1, 2, 20000) * np.exp2(rng.integers(-126, 128, 20000))).astype(np.float32)
    x = np.concatenate([specials("f32"), sub, -sub, wide, -wide])
    _check(name, x)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    got = compiled(name, "f32")(edge)
    assert np.isnan(got[2:]).all()
    assert got[1].view(np.uint32) == (np.float32(1.0) if name == "cos" else np.float32(-0.0)).view(np.uint32)
    assert got[0].view(np.uint32) == (np.float32(1.0) if name == "cos" else np.float32(0.0)).view(np.uint32)
