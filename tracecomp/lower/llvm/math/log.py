"""Logarithms: log, log2, log1p (and the pieces pow's f32 path needs).

x = 2^k m with m in [sqrt(1/2), sqrt(2)) is split off with integer arithmetic on the
bits (subnormals are first scaled by 2^(p+1)), f = m - 1 is exact, and
log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f / (2 + f), the form of fdlibm's log:
every term after f is small, so f's exactness carries the accuracy. k ln2 is added as
k ln2_hi (exact, ln2_hi has few bits) + k ln2_lo. log2 keeps f - f^2/2 in two pieces so
the multiplication by 1/ln2 does not round away the low bits.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .consts import LN2, LOG2E, round_to, split
from .core import Emit
from .exp import coeffs


@dataclass
class LogParts:
    k: ir.Value        # exponent, as a float
    f: ir.Value        # m - 1, exact
    s: ir.Value        # f / (2 + f)
    hfsq: ir.Value     # f^2 / 2
    r: ir.Value        # R(s^2)


def exponent_mantissa(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """k (as a float) and m in [sqrt(1/2), sqrt(2)) with x = 2^k m, for positive finite x."""
    fmt = e.fmt
    sub = e.cmp("<", x, 2.0 ** (1 - fmt.bias))
    x = e.select(sub, e.mul(x, 2.0 ** (fmt.prec + 1)), x)
    sqrt_half = e.bits(e.c(round_to(type(LN2)(7071067811865475244, 10 ** 19), fmt)))
    one = e.bits(e.c(1.0))
    # musl's trick: shift the bit pattern so that the exponent field rounds m into
    # [sqrt(1/2), sqrt(2)) instead of [1, 2).
    ix = e.iadd(e.bits(x), e.isub(one, sqrt_half))
    k = e.isub(e.ashr(ix, fmt.mant), fmt.bias)
    k = e.select(sub, e.isub(k, fmt.prec + 1), k)
    m = e.from_bits(e.iadd(e.iand(ix, (1 << fmt.mant) - 1), sqrt_half))
    return e.to_float(k), m


def log_parts(e: Emit, x: ir.Value) -> LogParts:
    """Decompose a positive finite x (subnormals included)."""
    k, m = exponent_mantissa(e, x)
    f = e.sub(m, 1.0)
    s = e.div(f, e.add(f, 2.0))
    z = e.mul(s, s)
    r = e.mul(z, e.poly(z, coeffs(e, "log")))
    return LogParts(k, f, s, e.mul(e.mul(f, f), 0.5), r)


def _ln2_split(e: Emit) -> tuple[float, float]:
    # k has at most 11 bits (f64) / 8 bits (f32), so k * hi is exact.
    return split(LN2, e.fmt, e.fmt.prec - 12)


def log_from_parts(e: Emit, p: LogParts, extra: ir.Value | None = None) -> ir.Value:
    """k ln2 + log(1 + f) (+ extra, a small correction such as log1p's c/u)."""
    hi, lo = _ln2_split(e)
    tail = e.mul(p.k, lo) if extra is None else e.fma(p.k, lo, extra)
    inner = e.sub(p.hfsq, e.fma(p.s, e.add(p.hfsq, p.r), tail))
    return e.fma(p.k, hi, e.neg(e.sub(inner, p.f)))


def _log_specials(e: Emit, x: ir.Value, res: ir.Value, at: float = 0.0) -> ir.Value:
    """NaN for x < at, -inf at x == at, +inf for +inf, NaN for NaN."""
    inf = float("inf")
    return e.finish(x, res, [
        (e.cmp("==", x, inf), inf),
        (e.cmp("==", x, at), -inf),
        (e.b.fcmp_unordered("<", x, e.c(at)), float("nan")),   # also NaN inputs
    ])


def emit_log(e: Emit, x: ir.Value) -> ir.Value:
    return _log_specials(e, x, log_from_parts(e, log_parts(e, x)))


def emit_log2(e: Emit, x: ir.Value) -> ir.Value:
    p = log_parts(e, x)
    fmt = e.fmt
    # hi = f - f^2/2 with its low bits cleared and 1/ln2 = ihi + ilo, ihi short, so that
    # hi * ihi is exact (fdlibm's e_log2.c)
    clear = 12 if fmt.bits == 32 else 32
    hi = e.sub(p.f, p.hfsq)
    hi = e.from_bits(e.iand(e.bits(hi), ~((1 << clear) - 1)))
    lo = e.fma(p.s, e.add(p.hfsq, p.r), e.sub(e.sub(p.f, hi), p.hfsq))
    ihi, ilo = split(LOG2E, fmt, clear)
    val_hi = e.mul(hi, ihi)
    val_lo = e.fma(lo, ihi, e.mul(e.add(lo, hi), ilo))
    w = e.add(p.k, val_hi)                      # k is an integer: exact or nearly
    val_lo = e.add(val_lo, e.add(e.sub(p.k, w), val_hi))
    return _log_specials(e, x, e.add(val_lo, w))


def emit_log1p(e: Emit, x: ir.Value) -> ir.Value:
    """log(u) + c/u where u + c == 1 + x exactly (TwoSum)."""
    u, c = e.two_sum(e.c(1.0), x)
    p = log_parts(e, e.select(e.cmp(">", u, 0.0), u, 1.0))
    res = log_from_parts(e, p, e.div(c, u))
    res = _log_specials(e, x, res, at=-1.0)
    return e.select(e.cmp("==", x, 0.0), x, res)      # log1p(-0) = -0
