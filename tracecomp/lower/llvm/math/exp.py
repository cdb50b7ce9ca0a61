"""Exponential family: exp, exp2, expm1, and tanh, sigmoid built on them.

All use the reduction x = k ln2 + r, |r| <= ln2/2 (k = rint(x / ln2)), where
r = fma(-k, ln2_hi, x) is exact: ln2_hi is ln2 rounded to the format, k ln2_hi is a
multiple of ulp(ln2_hi) and |x - k ln2_hi| < 1/2, so the difference fits the significand.
A second fma subtracts k ln2_lo. Then e^r comes from a minimax polynomial and 2^k is
applied by `Emit.scale` (two power-of-two multiplies), which rounds subnormal results
once and overflows to inf by itself, so no special case is needed at either end.

Inputs are clamped to a range where k is small (beyond it the result is already 0, -1
or inf) and NaN is replaced by 0 before `fptosi`, which would otherwise yield poison;
the NaN is put back by a select at the end.
"""
from __future__ import annotations

from llvmlite import ir

from .coeffs import F32 as C32, F64 as C64
from .consts import LN2, LOG2E, round_to
from .core import Emit


def coeffs(e: Emit, name: str) -> list[float]:
    return (C32 if e.fmt.bits == 32 else C64)[name][0]


def clamp(e: Emit, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """x limited to [lo, hi], NaN mapped to 0 (safe for fptosi after scaling)."""
    x = e.select(e.cmp(">", x, hi), hi, x)
    x = e.select(e.cmp("<", x, lo), lo, x)
    return e.select(e.isnan(x), 0.0, x)


def _limits(e: Emit) -> tuple[float, float]:
    """Clamp range for exp: beyond it e^x is inf (above) or rounds to 0 (below)."""
    return (-104.0, 89.0) if e.fmt.bits == 32 else (-746.0, 710.0)


def reduce_ln2(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """k (float, integral) and r = x - k ln2 for a clamped x."""
    k = e.rint(e.mul(x, round_to(LOG2E, e.fmt)))
    hi = round_to(LN2, e.fmt)
    lo = round_to(LN2 - type(LN2)(hi), e.fmt)
    r = e.fma(e.neg(k), hi, x)          # exact, see module docstring
    return k, e.fma(e.neg(k), lo, r)


def exp_core(e: Emit, x: ir.Value, xlo: ir.Value | None = None) -> ir.Value:
    """e^(x + xlo) for finite x (any magnitude) with |xlo| <= ulp(x); NaN maps to garbage."""
    lo, hi = _limits(e)
    xc = clamp(e, x, lo, hi)
    k, r = reduce_ln2(e, xc)
    if xlo is not None:
        r = e.add(r, xlo)
    # e^r = 1 + (r + r^2 Q(r)): the small part is summed first, 1 added last.
    p = e.add(1.0, e.fma(e.mul(r, r), e.poly(r, coeffs(e, "exp")), r))
    return e.scale(p, e.to_int(k))


def emit_exp(e: Emit, x: ir.Value) -> ir.Value:
    return e.select(e.isnan(x), x, exp_core(e, x))


def emit_exp2(e: Emit, x: ir.Value) -> ir.Value:
    lo, hi = (-151.0, 129.0) if e.fmt.bits == 32 else (-1076.0, 1025.0)
    xc = clamp(e, x, lo, hi)
    k = e.rint(xc)
    r = e.sub(xc, k)                    # exact
    p = e.fma(r, e.poly(r, coeffs(e, "exp2")), 1.0)
    return e.select(e.isnan(x), x, e.scale(p, e.to_int(k)))


def expm1_core(e: Emit, x: ir.Value) -> ir.Value:
    """e^x - 1 for non-NaN x (NaN gives garbage; -0 gives +0)."""
    prec = e.fmt.prec
    lo = -float(prec + 3) * 0.7         # e^x - 1 rounds to -1 below this
    hi = 89.0 if e.fmt.bits == 32 else 710.0
    xc = clamp(e, x, lo, hi)
    k, r = reduce_ln2(e, xc)            # k = 0 gives r = x exactly
    # expm1(r) = r + r^2 (1/2 + r Q(r)), no cancellation for |r| <= ln2/2
    em = e.fma(e.mul(r, r), e.fma(r, e.poly(r, coeffs(e, "expm1")), 0.5), r)
    ki = e.to_int(k)
    # k <= prec: 2^k em + (2^k - 1), where 2^k - 1 is exact; one rounding (fma).
    t = e.pow2i(e.iselect(e.icmp(">", ki, prec), prec, ki))
    small = e.fma(t, em, e.sub(t, 1.0))
    # k > prec: the -1 barely matters; scale in two steps so that overflow gives inf.
    big = e.sub(e.scale(e.add(em, 1.0), ki), 1.0)
    return e.select(e.icmp(">", ki, prec), big, small)


def emit_expm1(e: Emit, x: ir.Value) -> ir.Value:
    res = expm1_core(e, x)
    # expm1(-0) = -0 and NaN stays NaN
    return e.select(e.or_(e.cmp("==", x, 0.0), e.isnan(x)), x, res)


def emit_tanh(e: Emit, x: ir.Value) -> ir.Value:
    """tanh|x| = t / (t + 2), t = expm1(2|x|); tanh(x) rounds to +-1 past the clamp."""
    thr = 9.5 if e.fmt.bits == 32 else 20.0
    ax = e.abs(x)
    ax = e.select(e.cmp(">", ax, thr), thr, ax)
    t = expm1_core(e, e.mul(ax, 2.0))
    res = e.copysign(e.div(t, e.add(t, 2.0)), x)      # keeps tanh(-0) = -0
    return e.select(e.isnan(x), x, res)


def emit_sigmoid(e: Emit, x: ir.Value) -> ir.Value:
    """1 / (1 + e^-x) as 1/(1+t) for x >= 0 and t/(1+t) for x < 0, t = e^-|x| <= 1:
    no overflow, and e^x's subnormal results for very negative x are kept."""
    t = exp_core(e, e.neg(e.abs(x)))
    num = e.select(e.cmp("<", x, 0.0), t, 1.0)
    res = e.div(num, e.add(t, 1.0))
    return e.select(e.isnan(x), x, res)
