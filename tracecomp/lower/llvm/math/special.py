"""erf, atan2/atan and pow.

erf: |x| < 1: x + x P(x^2). 1 <= |x| <= X: 1 - e^(-x^2) g(x) with g = e^(x^2) erfc(x)
piecewise polynomial in (x - mid); the pieces share one Horner loop, their coefficients
chosen by selects. x^2 is carried as hi + lo (fma) into exp, since an error of d in x^2
becomes a relative error d in e^(-x^2). Past X, erf rounds to +-1.

atan2: u = min(|x|,|y|) / max(...), further reduced by atan(t) = pi/4 + atan((t-1)/(t+1))
for t > tan(pi/8) (one division either way); the angle is then j pi/4 +- atan(u) with j
in 0..4 chosen by the octant, j pi/4 added as an exact hi part plus a lo part.

pow: f64 computes log|x| as a double-double (about 2^-70 relative): x = 2^k m,
log m = 2 atanh(s) = 2s + 2s^3/3 + s^5 L(s^2) with s = (m-1)/(m+1) and the first two terms
in double-double, so that y log|x| (up to 745 in size) keeps the 2^-53 absolute accuracy
exp needs. f32 computes log2 and exp2 in double, which is ample (|y log2 x| <= 150).
C99 Annex F's special cases are applied by selects at the end.
"""
from __future__ import annotations

from fractions import Fraction

from llvmlite import ir

from .coeffs import F32 as C32, F64 as C64
from .consts import LN2, PIO4, parts, round_to, split
from .core import F64, Emit
from .exp import coeffs, emit_exp2, exp_core
from .log import emit_log2, exponent_mantissa

INF = float("inf")
NAN = float("nan")


# ------------------------------------------------------------------------------- erf
def emit_erf(e: Emit, x: ir.Value) -> ir.Value:
    table = C32 if e.fmt.bits == 32 else C64
    pieces = sorted((v for k, v in table.items() if k.startswith("erfc")), key=lambda v: v[2])
    ax = e.abs(x)
    small = e.fma(ax, e.poly(e.mul(ax, ax), coeffs(e, "erf_small")), ax)
    xmax = pieces[-1][3]
    axc = e.select(e.cmp(">", ax, xmax), xmax, ax)
    axc = e.select(e.cmp("<", axc, 1.0), 1.0, axc)
    # piece i covers [a_i, b_i]: select its midpoint and coefficients
    mid, cs = e.c((pieces[0][2] + pieces[0][3]) / 2), [e.c(c) for c in pieces[0][0]]
    for cf, _, a, b in pieces[1:]:
        inside = e.cmp(">=", axc, a)
        mid = e.select(inside, (a + b) / 2, mid)
        cs = [e.select(inside, c, old) for c, old in zip(cf, cs)]
    t = e.sub(axc, mid)
    g = cs[-1]
    for c in reversed(cs[:-1]):
        g = e.fma(g, t, c)
    hi, lo = e.two_prod(axc, axc)
    large = e.fma(e.neg(exp_core(e, e.neg(hi), e.neg(lo))), g, 1.0)
    res = e.copysign(e.select(e.cmp("<", ax, 1.0), small, large), x)    # erf(-0) = -0
    return e.select(e.isnan(x), x, res)


# ------------------------------------------------------------------------------- atan2
def emit_atan2(e: Emit, y: ir.Value, x: ir.Value) -> ir.Value:
    ay, ax = e.abs(y), e.abs(x)
    swap = e.cmp(">", ay, ax)
    num, den = e.select(swap, ax, ay), e.select(swap, ay, ax)     # num <= den
    # keep num + den finite (both are huge whenever the sum is formed), and den * tan(pi/8)
    # exact (subnormals scaled up)
    shrink = e.cmp(">", den, 2.0 ** (e.fmt.emax - 2))
    grow = e.cmp("<", den, 2.0 ** (e.fmt.prec + 1 - e.fmt.bias))
    factor = e.select(shrink, 0.25, e.select(grow, 2.0 ** (e.fmt.prec + 1), 1.0))
    num, den = e.mul(num, factor), e.mul(den, factor)
    both_inf = e.and_(e.isinf(x), e.isinf(y))
    upper = e.or_(e.cmp(">", num, e.mul(den, round_to(Fraction(41421356237309504880, 10 ** 20), e.fmt))),
                  both_inf)                                      # t > tan(pi/8): use pi/4 + ...
    u = e.div(e.select(upper, e.sub(num, den), num), e.select(upper, e.add(num, den), den))
    u = e.select(e.or_(both_inf, e.cmp("==", den, 0.0)), 0.0, u)  # inf/inf, 0/0
    z = e.mul(u, u)
    a = e.fma(e.mul(u, z), e.poly(z, coeffs(e, "atan")), u)
    # angle = B + s (C + a): B = 0, pi/2, pi by (swap, x < 0), C = 0 or pi/4, s = +-1
    xneg = e.icmp("<", e.bits(x), 0)
    same = e.b.icmp_unsigned("==", swap, xneg)
    s = e.select(same, 1.0, -1.0)
    base = e.select(swap, 2.0, e.select(xneg, 4.0, 0.0))
    j = e.fma(s, e.select(upper, 1.0, 0.0), base)                 # angle / (pi/4), exact
    hi, lo = split(PIO4, e.fmt, e.fmt.prec - 3)                   # j * hi exact for j <= 4
    res = e.fma(j, hi, e.fma(j, lo, e.mul(s, a)))
    res = e.copysign(res, y)
    return e.select(e.or_(e.isnan(x), e.isnan(y)), e.add(x, y), res)


def emit_atan(e: Emit, x: ir.Value) -> ir.Value:
    return emit_atan2(e, x, e.c(1.0))


# ------------------------------------------------------------------------------- pow
def _log_dd(e: Emit, ax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """log(ax) as hi + lo for positive finite ax (f64)."""
    k, m = exponent_mantissa(e, ax)
    f = e.sub(m, 1.0)                                    # exact
    dh, dl = e.two_sum(m, e.c(1.0))
    s = e.div(f, dh)
    rem = e.fma(e.neg(s), dl, e.fma(e.neg(s), dh, f))
    sl = e.div(rem, dh)                                  # s + sl = f / (m + 1)
    zh, zl = e.two_prod(s, s)
    zl = e.fma(e.mul(s, 2.0), sl, zl)
    th, tl = e.two_prod(s, zh)
    tl = e.add(tl, e.fma(s, zl, e.mul(sl, zh)))          # s^3
    c1, c2 = parts(Fraction(2, 3), F64, 2)
    uh, ul = e.two_prod(e.c(c1), th)
    ul = e.add(ul, e.fma(e.c(c1), tl, e.mul(e.c(c2), th)))   # 2 s^3 / 3
    rest = e.mul(e.mul(th, zh), e.poly(zh, coeffs(e, "log_pow")))
    a, b = e.fast_two_sum(e.mul(s, 2.0), uh)
    b = e.add(b, e.add(e.fma(sl, 2.0, ul), rest))
    lhi, llo = split(LN2, e.fmt, e.fmt.prec - 12)
    h, l = e.two_sum(e.mul(k, lhi), a)
    l = e.add(l, e.fma(k, llo, b))
    return e.fast_two_sum(h, l)


def _pow_core(e: Emit, ax: ir.Value, y: ir.Value) -> ir.Value:
    """|x|^y for finite positive ax and finite y (other inputs: any value)."""
    if e.fmt.bits == 32:
        d = e.other(F64)
        l2 = emit_log2(d, e.convert(ax, F64))
        return d.convert(emit_exp2(d, d.mul(e.convert(y, F64), l2)), e.fmt)
    lh, ll = _log_dd(e, ax)
    zh = e.mul(y, lh)
    zl = e.fma(y, ll, e.fma(y, lh, e.neg(zh)))
    zl = e.select(e.cmp("<", e.abs(zh), 1000.0), zl, 0.0)   # past exp's range lo is moot
    return exp_core(e, zh, zl)


def emit_pow(e: Emit, x: ir.Value, y: ir.Value) -> ir.Value:
    ax, ay = e.abs(x), e.abs(y)
    finite_y = e.cmp("<", ay, INF)
    yint = e.and_(finite_y, e.cmp("==", e.rint(y), y))
    yh = e.mul(y, 0.5)
    yodd = e.and_(yint, e.cmp("!=", e.rint(yh), yh))
    xneg = e.icmp("<", e.bits(x), 0)                  # sign bit, so -0 counts
    res = _pow_core(e, ax, y)
    res = e.select(e.and_(xneg, yodd), e.neg(res), res)
    neg_nonint = e.and_(e.cmp("<", x, 0.0), e.cmp(">", x, -INF), finite_y, e.not_(yint))
    ypos = e.cmp(">", y, 0.0)
    # x = +-0 or +-inf: magnitude 0 or inf by the signs of y and log|x|; odd y keeps x's sign
    zero_or_inf = e.or_(e.cmp("==", x, 0.0), e.isinf(x))
    mag = e.select(e.b.icmp_unsigned("==", ypos, e.cmp("==", x, 0.0)), 0.0, INF)
    mag = e.select(e.and_(xneg, yodd), e.neg(mag), mag)
    # y = +-inf: 1 at |x| = 1, else 0 or inf by whether |x| < 1 matches y > 0
    yinf_val = e.select(e.b.icmp_unsigned("==", ypos, e.cmp("<", ax, 1.0)), 0.0, INF)
    yinf_val = e.select(e.cmp("==", ax, 1.0), 1.0, yinf_val)
    return e.finish(x, res, [
        (neg_nonint, NAN),
        (e.not_(finite_y), yinf_val),
        (zero_or_inf, mag),
        (e.or_(e.isnan(x), e.isnan(y)), e.add(x, y)),
        (e.or_(e.cmp("==", y, 0.0), e.cmp("==", x, 1.0)), 1.0),
    ])
