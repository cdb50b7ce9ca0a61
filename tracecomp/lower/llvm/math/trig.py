"""sin, cos, tan: argument reduction x = n pi/2 + r, |r| <= pi/4, then sin/cos kernels.

f32 (computed in double, rounded once at the end):
  |x| < 2^23: Cody-Waite in double, r = fma(-k, P1, |x|) (exact: both are multiples of
  2^-52 and the difference is below 2) minus k P2; k < 2^23 leaves k P3 < 2^-83.
  |x| >= 2^23: Payne-Hanek in 64-bit integers (below), exact for every float32.
f64:
  |x| < 2^40: the same Cody-Waite with k P2 as an exact product (two_prod), r kept as a
  double-double (hi, lo); k P4 < 2^-121 is dropped.
  |x| >= 2^40: Payne-Hanek with a 192-bit window of 2/pi and 128 result bits, r as a
  double-double. Both paths are always computed (straight-line code) and selected.

Payne-Hanek: x = m 2^e with an integer m. Bits of 2/pi of weight above 2^(1-e) contribute
multiples of 4 to x 2/pi and are skipped, so only a window of 2/pi starting at bit e-1 is
multiplied by m, in integer arithmetic; the top two bits of the product are n mod 4 and
the rest the fraction. The window is cut from 64-bit words of 2/pi with funnel shifts
(llvm.fshl) at a lane-dependent bit offset; the words are picked by selects from a short
list of constants, never by a memory gather.
"""
from __future__ import annotations

from llvmlite import ir

from .coeffs import F32 as C32
from .consts import PIO2, TWO_OVER_PI, parts, round_to, two_over_pi_bits
from .core import F64, Emit
from .exp import coeffs

_M64 = (1 << 64) - 1


def _words(count: int) -> list[int]:
    """64-bit words of 2/pi's fraction, preceded by one zero word (bit j has weight 2^-j)."""
    t = two_over_pi_bits(64 * (count - 1))
    return [0] + [(t >> (64 * (count - 1 - i))) & _M64 for i in range(1, count)]


def _pick(e: Emit, q: ir.Value, table: list[int]) -> ir.Value:
    """table[q] for a lane value q (i64) by a chain of selects (q past the end: last entry)."""
    out = e.ci(table[-1], 64)
    for i in range(len(table) - 2, -1, -1):
        out = e.iselect(e.icmp("==", q, i), table[i], out, 64)
    return out


def _window(e: Emit, p0: ir.Value, nwords: int, ntable: int) -> list[ir.Value]:
    """nwords 64-bit words of the padded 2/pi bit string starting at bit p0 (i64 >= 0)."""
    w = _words(ntable)
    q, sh = e.lshr(p0, 6), e.iand(p0, 63)
    # two stages: blocks of 4 words by q >> 2, then the word within by q & 3
    qb, qw = e.lshr(q, 2), e.iand(q, 3)
    nblocks = (ntable - nwords - 1) // 4 + 1
    span = [_pick(e, qb, [w[4 * b + i] if 4 * b + i < ntable else 0 for b in range(nblocks)])
            for i in range(nwords + 4)]
    sel = []
    for off in range(nwords + 1):
        out = span[off + 3]
        for i in (2, 1, 0):
            out = e.b.select(e.icmp("==", qw, i), span[off + i], out)
        sel.append(out)
    return [e.fshl(sel[i], sel[i + 1], sh) for i in range(nwords)]


def _unpack(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """|x| = m 2^ee with m, ee as i64 (normal numbers)."""
    fmt = e.fmt
    ix = e.zext(e.bits(x), 64)
    biased = e.iand(e.lshr(ix, fmt.mant), (1 << (fmt.bits - 1 - fmt.mant)) - 1)
    m = e.ior(e.iand(ix, (1 << fmt.mant) - 1), 1 << fmt.mant)
    return m, e.isub(biased, fmt.bias + fmt.mant)


def _split_quadrant(e: Emit, top: ir.Value) -> tuple[ir.Value, ir.Value]:
    """n = round(top / 2^62) and the signed remainder top - n 2^62 in [-2^61, 2^61)."""
    n = e.lshr(e.iadd(top, 1 << 61), 62)
    return n, e.isub(top, e.shl(n, 62))


def reduce_large_f32(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(n, r) with |x| = n pi/2 + r, for float32 |x| >= 2^23 (garbage below); r in double."""
    d = e.other(F64)
    m, ee = _unpack(e, x)
    p0 = e.iadd(ee, 62)          # window starts at 2/pi bit ee - 1; the zero word pads 63 bits
    p0 = e.iselect(e.icmp("<", p0, 0), 0, p0)
    hi, lo = _window(e, p0, 2, 5)
    a1, a0, a2 = e.lshr(hi, 32), e.iand(hi, 0xFFFFFFFF), e.lshr(lo, 32)
    # y = m * (a1:a0:a2) / 2^94 mod 4; keep bits 32..95 of the product (2 + 62 bits)
    top = e.iadd(e.iadd(e.shl(e.imul(m, a1), 32), e.imul(m, a0)), e.lshr(e.imul(m, a2), 32))
    n, frac = _split_quadrant(e, top)
    r = d.mul(d.to_float_wide(frac), round_to(PIO2, F64) * 2.0 ** -62)
    return n, r


def reduce_large_f64(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(n, r_hi, r_lo) for double |x| >= 2^40 (garbage below)."""
    m, ee = _unpack(e, x)
    p0 = e.iadd(ee, 62)
    p0 = e.iselect(e.icmp("<", p0, 0), 0, p0)
    words = _window(e, p0, 3, 20)                         # 192 bits: 2/pi bits ee-1 ...
    w = [f(word) for word in words for f in (lambda v: e.lshr(v, 32), lambda v: e.iand(v, 0xFFFFFFFF))]
    mh = [e.iand(m, 0xFFFFFFFF), e.lshr(m, 32)]           # m = mh[1] 2^32 + mh[0]
    # column sums of 32x32-bit products; limb t has weight 2^(32 t); w[i] sits at limb 5 - i
    cols = [e.ci(0, 64) for _ in range(8)]
    for h, mv in enumerate(mh):
        for i, wv in enumerate(w):
            t = 5 - i + h
            prod = e.imul(mv, wv)
            cols[t] = e.iadd(cols[t], e.iand(prod, 0xFFFFFFFF))
            cols[t + 1] = e.iadd(cols[t + 1], e.lshr(prod, 32))
    limbs, carry = [], e.ci(0, 64)
    for t in range(6):                                     # the product mod 2^192
        v = e.iadd(cols[t], carry)
        limbs.append(e.iand(v, 0xFFFFFFFF))
        carry = e.lshr(v, 32)
    top = e.ior(e.shl(limbs[5], 32), limbs[4])             # binary point after bit 62 of top
    low = e.ior(e.shl(limbs[3], 32), limbs[2])
    n, frac = _split_quadrant(e, top)
    t1 = e.to_float_wide(frac)
    t2 = e.to_float_wide(e.isub(frac, e.to_int_wide(t1)))   # what t1 rounded off (exact)
    t3 = e.mul(e.to_float_wide(e.lshr(low, 11)), 2.0 ** -53)
    hi, lo = e.two_sum(t1, e.add(t2, t3))
    p1, p2 = (v * 2.0 ** -62 for v in parts(PIO2, F64, 2))
    r_hi = e.mul(hi, p1)
    r_lo = e.add(e.fma(hi, p1, e.neg(r_hi)), e.fma(lo, p1, e.mul(hi, p2)))
    return n, r_hi, r_lo


def _reduce_f32(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(n i64, r double) for |x| (float32)."""
    d = e.other(F64)
    ax = d.abs(e.convert(x, F64))
    small = d.cmp("<", ax, 2.0 ** 23)
    axs = d.select(small, ax, 0.0)
    k = d.rint(d.mul(axs, round_to(TWO_OVER_PI, F64)))
    p1, p2 = parts(PIO2, F64, 2)
    r = d.fma(d.neg(k), p2, d.fma(d.neg(k), p1, axs))
    n_big, r_big = reduce_large_f32(e, x)
    return e.b.select(small, d.to_int(k, 64), n_big), d.select(small, r, r_big)


def _reduce_f64(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    ax = e.abs(x)
    small = e.cmp("<", ax, 2.0 ** 40)
    axs = e.select(small, ax, 0.0)
    k = e.rint(e.mul(axs, round_to(TWO_OVER_PI, F64)))
    p1, p2, p3 = parts(PIO2, F64, 3)
    r1 = e.fma(e.neg(k), p1, axs)                          # exact
    p, pe = e.two_prod(k, p2)
    hi, lo = e.two_sum(r1, e.neg(p))
    lo = e.sub(lo, e.fma(k, p3, pe))
    hi, lo = e.fast_two_sum(hi, lo)
    n_big, hi_big, lo_big = reduce_large_f64(e, x)
    return (e.b.select(small, e.to_int(k, 64), n_big), e.select(small, hi, hi_big),
            e.select(small, lo, lo_big))


def _kernels(e: Emit, r: ir.Value, lo: ir.Value | None) -> tuple[ir.Value, ir.Value]:
    """sin(r + lo), cos(r + lo) for |r| <= pi/4 (lo: the double-double tail, or None)."""
    z = e.mul(r, r)
    sp = e.poly(z, coeffs(e, "sin") if e.fmt.bits == 64 else _f32_trig("sin"))
    cp = e.poly(z, coeffs(e, "cos") if e.fmt.bits == 64 else _f32_trig("cos"))
    hz = e.mul(z, 0.5)
    w = e.sub(1.0, hz)
    if lo is None:
        s = e.fma(e.mul(r, z), sp, r)
        c = e.add(w, e.fma(e.mul(z, z), cp, e.sub(e.sub(1.0, w), hz)))
        return s, c
    # sin(r+lo) ~ sin r + lo (1 - r^2/2); cos(r+lo) ~ cos r - lo r
    s = e.add(r, e.fma(e.mul(r, z), sp, e.fma(e.neg(hz), lo, lo)))
    tail = e.fma(e.mul(z, z), cp, e.neg(e.mul(r, lo)))
    c = e.add(w, e.add(e.sub(e.sub(1.0, w), hz), tail))      # recovers 1 - hz's rounding
    return s, c


def _f32_trig(name: str) -> list[float]:
    """The f32 kernels' (shorter) polynomials, stored rounded to double."""
    return C32[name][0]


def _assemble(e: Emit, n: ir.Value, s: ir.Value, c: ir.Value, fn: str) -> ir.Value:
    """Pick by quadrant: sin(n pi/2 + r) cycles s, c, -s, -c; cos is one quadrant ahead."""
    if fn == "cos":
        n = e.iadd(n, 1)
    odd = e.icmp("!=", e.iand(n, 1), 0)
    if fn == "tan":
        return e.select(odd, e.neg(e.div(c, s)), e.div(s, c))
    v = e.select(odd, c, s)
    return e.select(e.icmp("!=", e.iand(n, 2), 0), e.neg(v), v)


def emit_trig(e: Emit, x: ir.Value, fn: str) -> ir.Value:
    if e.fmt.bits == 32:
        d = e.other(F64)
        n, r = _reduce_f32(e, x)
        s, c = _kernels(d, r, None)
        res = d.convert(_assemble(d, n, s, c, fn), e.fmt)
    else:
        n, hi, lo = _reduce_f64(e, x)
        s, c = _kernels(e, hi, lo)
        res = _assemble(e, n, s, c, fn)
    if fn != "cos":   # odd functions: we reduced |x|, so give back x's sign (keeps -0)
        sign = e.iand(e.bits(x), e.fmt.sign_bit)
        res = e.from_bits(e.ixor(e.bits(res), sign))
    # inf and NaN give NaN
    return e.select(e.cmp("<", e.abs(x), float("inf")), res, e.sub(x, x))


def emit_sin(e: Emit, x: ir.Value) -> ir.Value:
    return emit_trig(e, x, "sin")


def emit_cos(e: Emit, x: ir.Value) -> ir.Value:
    return emit_trig(e, x, "cos")


def emit_tan(e: Emit, x: ir.Value) -> ir.Value:
    return emit_trig(e, x, "tan")
