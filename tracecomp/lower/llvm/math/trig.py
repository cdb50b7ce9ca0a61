"""sin, cos, tan: argument reduction x = n pi/2 + r, |r| <= pi/4, then sin/cos kernels.

f32: the reduction runs in double, then sin and cos run in float32 (twice the lanes per
vector) on r split into a float32 pair hi + lo, within 1 ulp; tan's quotient s / c is taken
in double and rounded once, so tan stays correctly rounded. The reduction is one
straight-line path for every lane, with no integer multiplies. x 2/pi mod 4 is x G0 + x G1
+ x G2 mod 4, where G = G0+G1+G2 (three doubles, ~159 bits) is 2/pi for |x| < 2^52 and, in
each of three buckets of larger |x| (from 2^52, 2^80, 2^108), (2^s 2/pi mod 4) 2^-s with
2^s the bucket's least float32 ulp: there N = |x| 2^-s is an integer, so replacing 2^s 2/pi
by its residue mod 4 leaves N 2^s 2/pi mod 4 unchanged. N < 2^51 in every bucket, so x G0
splits exactly into p0 + e0 (fma), a = p0 mod 4 is exact, |e0| and |x G1| stay below 1, n
is the rounded a + e0 + x G1, and (a - n) + e0 is exact (for |x| >= 2^23, a multiple of
G0's last bit below 2 G0's binade); the last two terms round relative to the small result.
The bucket's G is picked by compares and selects. No integer multiplies or 64-bit
conversions: the quadrant is a small integer in double, taken to i32 by cvttpd2dq, native
on every x86 target, so AVX2 and AVX-512 compute the same bits. The dependency chain is
kept short (the loop is latency-bound, not throughput-bound): the bucket compares run on
float32 |x| beside its conversion.
f64:
  |x| < 2^40: Cody-Waite in double with k P2 as an exact product (two_prod), r kept as a
  double-double (hi, lo); k P4 < 2^-121 is dropped.
  |x| >= 2^40: Payne-Hanek with a 192-bit window of 2/pi and 128 result bits, r as a
  double-double. Both paths are always computed (straight-line code) and selected.

On a GPU (an nvptx module), f32 sin and cos first try a float32 Cody-Waite reduction,
r = |x| - n (P1 + P2 + P3) by three fmas with pi/2 in three float32 pieces, for a thread
whose |x| < 2^16, and take the double path above only otherwise (a branch: a GPU thread
runs one path, while the CPU's SIMD lanes must run one straight line).  The first fma is
exact (|x| - n P1 < 1 fits 24 bits of P1's last bit), the others round relative to the
result, and the pieces hold pi/2 to 2^-72, so r keeps float32 precision down to the
smallest |r| a float32 below 2^16 reaches (about 2^-29); sin and cos then run as above
with no low part: within 2 ulp, as CUDA's sinf.  Double arithmetic runs at half the float
rate or less on a GPU, and that reduction was a quarter of W1's instructions.

Payne-Hanek: x = m 2^e with an integer m. Bits of 2/pi of weight above 2^(1-e) contribute
multiples of 4 to x 2/pi and are skipped, so only a window of 2/pi starting at bit e-1 is
multiplied by m, in integer arithmetic; the top two bits of the product are n mod 4 and
the rest the fraction. The window is cut from 64-bit words of 2/pi with funnel shifts
(llvm.fshl) at a lane-dependent bit offset; the words are picked by selects from a short
list of constants, never by a memory gather.
"""
from __future__ import annotations

from fractions import Fraction

from llvmlite import ir

from .consts import PIO2, TWO_OVER_PI, parts, round_to, two_over_pi_bits
from .core import F32, F64, Emit, Value
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


# float32 reduction buckets: (least |x|, s); s = log2 of the least float32 ulp there
F32_BUCKETS = ((0.0, 0), (2.0 ** 52, 29), (2.0 ** 80, 57), (2.0 ** 108, 85))


def f32_factors(lo: float, s: int) -> list[float]:
    """G0, G1, G2 of a bucket: 2/pi below 2^52, else (2^s 2/pi mod 4) 2^-s taken in
    [1/2, 9/2) (G0's last bit then weighs >= 2^-53 2^-s, so x G0 is a multiple of 2^-53)."""
    nbits = s + 240
    g = Fraction(two_over_pi_bits(nbits), 1 << nbits)
    if lo:
        f = g * 2 ** s % 4
        g = (f + 4 if f < Fraction(1, 2) else f) / 2 ** s
    return parts(g, F64, 3)


def _pick_bucket(e: Emit, ax32: ir.Value, consts: list[list[float]]) -> list[ir.Value]:
    """Per lane, the bucket's constants (doubles): a tree of selects two deep, keyed by
    compares of float32 |x| that run beside the conversion to double."""
    d = e.other(F64)
    up = [e.cmp(">=", ax32, lo) for lo, _ in F32_BUCKETS[1:]]       # 2^52, 2^80, 2^108
    low = [d.select(up[0], c1, c0) for c0, c1 in zip(consts[0], consts[1])]
    high = [d.select(up[2], c3, c2) for c2, c3 in zip(consts[2], consts[3])]
    return [d.select(up[1], h, lo) for lo, h in zip(low, high)]


def _reduce_f32(e: Emit, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(n i32, r double) with |x| = n pi/2 + r up to multiples of 2 pi (x float32)."""
    d = e.other(F64)
    ax32 = e.abs(x)
    ax = e.convert(ax32, F64)      # inf, NaN: n is poison, but emit_trig selects them away
    consts = []
    for lo, s in F32_BUCKETS:
        g0, g1, g2 = f32_factors(lo, s)
        consts.append([g0, g1, g2])
    g0, g1, g2 = _pick_bucket(e, ax32, consts)
    p0 = d.mul(ax, g0)
    a = d.fma(d.rint(d.mul(p0, 0.25)), -4.0, p0)           # p0 mod 4, exact, in [-2, 2]
    e0 = d.fma(ax, g0, d.neg(p0))                          # p0 + e0 = |x| G0 exactly
    n = d.rint(d.add(a, d.fma(ax, g1, e0)))                # may be off by one at a tie: harmless
    c = d.add(d.sub(a, n), e0)                             # exact for |x| >= 2^23
    f = d.fma(ax, g2, d.fma(ax, g1, c))                    # |x| 2/pi - n (mod 4), |f| <= 1/2
    return e.b.fptosi(n, ir.IntType(32)), d.mul(f, round_to(PIO2, F64))


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


def _kernels(e: Emit, r: ir.Value, lo: Value) -> tuple[ir.Value, ir.Value]:
    """sin(r + lo), cos(r + lo) in e's format, for |r| <= pi/4 and |lo| <= ulp(r). r^2 is
    taken exactly (z + ze) so that cos's 1 - r^2/2 loses nothing to z's rounding."""
    z, ze = e.two_prod(r, r)
    hz = e.mul(z, 0.5)
    w = e.sub(1.0, hz)
    sp, cp = e.poly(z, coeffs(e, "sin")), e.poly(z, coeffs(e, "cos"))
    # sin(r + lo) ~ sin r + lo (1 - r^2/2); cos(r + lo) ~ cos r - lo r
    s = e.add(r, e.fma(e.mul(r, z), sp, e.fma(e.neg(hz), lo, lo)))
    tail = e.fma(e.mul(z, z), cp, e.neg(e.fma(r, lo, e.mul(ze, 0.5))))
    c = e.add(w, e.add(e.sub(e.sub(1.0, w), hz), tail))      # recovers 1 - hz's rounding
    return s, c


def _assemble(e: Emit, n: ir.Value, s: ir.Value, c: ir.Value, fn: str) -> tuple[ir.Value, ir.Value]:
    """Pick by quadrant: sin(n pi/2 + r) cycles s, c, -s, -c; cos is one quadrant ahead.
    Returns the value before its sign and the sign bit to xor in (n & 2 moved to the top
    bit of the result format), so the negation joins x's sign in one xor at the end."""
    if fn == "cos":
        n = e.iadd(n, 1)
    odd = e.icmp("!=", e.iand(n, 1), 0)
    if fn == "tan":
        return e.select(odd, e.neg(e.div(c, s)), e.div(s, c)), e.ci(0, n.type.width)
    return e.select(odd, c, s), e.shl(e.iand(n, 2), n.type.width - 2)


GPU_FAST_LIMIT = 65536.0           # |x| below which a GPU thread reduces in float32


def _reduce_f32_fast(e: Emit, ax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(n i32, r float32) with ax = n pi/2 + r, for 0 <= ax < GPU_FAST_LIMIT."""
    p1, p2, p3 = parts(PIO2, F32, 3)
    k = e.rint(e.mul(ax, round_to(TWO_OVER_PI, F32)))
    r = e.fma(e.neg(k), p1, ax)                            # exact
    r = e.fma(e.neg(k), p3, e.fma(e.neg(k), p2, r))
    return e.b.fptosi(k, ir.IntType(32)), r


def _trig_f32(e: Emit, x: ir.Value, fn: str) -> tuple[ir.Value, ir.Value]:
    d = e.other(F64)
    n, r = _reduce_f32(e, x)
    hi = d.convert(r, e.fmt)
    lo = d.convert(d.sub(r, e.convert(hi, F64)), e.fmt)
    return _assemble(e, n, *_kernels(e, hi, lo), fn)


def _trig_f32_gpu(e: Emit, x: ir.Value, fn: str) -> tuple[ir.Value, ir.Value]:
    """The float32 reduction where |x| < GPU_FAST_LIMIT, else the double one (a branch)."""
    b = e.b
    ax = e.abs(x)
    with b.if_else(e.cmp("<", ax, GPU_FAST_LIMIT)) as (fast, slow):
        with fast:
            n, r = _reduce_f32_fast(e, ax)
            v_fast, flip_fast = _assemble(e, n, *_kernels(e, r, 0.0), fn)
            from_fast = b.block
        with slow:
            v_slow, flip_slow = _trig_f32(e, x, fn)
            from_slow = b.block
    v = b.phi(v_fast.type)
    v.add_incoming(v_fast, from_fast)
    v.add_incoming(v_slow, from_slow)
    flip = b.phi(flip_fast.type)
    flip.add_incoming(flip_fast, from_fast)
    flip.add_incoming(flip_slow, from_slow)
    return v, flip


def emit_trig(e: Emit, x: ir.Value, fn: str) -> ir.Value:
    if e.fmt.bits == 32 and fn != "tan" and e.module.triple.startswith("nvptx") and isinstance(x.type, ir.FloatType):
        v, flip = _trig_f32_gpu(e, x, fn)
    elif e.fmt.bits == 32 and fn == "tan":      # s / c in double: rounded once, at the end
        d = e.other(F64)
        n, r = _reduce_f32(e, x)
        v, flip = _assemble(d, n, *_kernels(d, r, 0.0), fn)
        v = d.convert(v, e.fmt)
    elif e.fmt.bits == 32:                    # r as a float32 pair, sin/cos in float32
        v, flip = _trig_f32(e, x, fn)
    else:
        n, hi, lo = _reduce_f64(e, x)
        v, flip = _assemble(e, n, *_kernels(e, hi, lo), fn)
    if fn != "cos":   # odd functions: we reduced |x|, so give back x's sign (keeps -0)
        flip = e.ixor(flip, e.iand(e.bits(x), e.fmt.sign_bit))
    res = e.from_bits(e.ixor(e.bits(v), flip))
    # inf and NaN give NaN
    return e.select(e.cmp("<", e.abs(x), float("inf")), res, e.sub(x, x))


def emit_sin(e: Emit, x: ir.Value) -> ir.Value:
    return emit_trig(e, x, "sin")


def emit_cos(e: Emit, x: ir.Value) -> ir.Value:
    return emit_trig(e, x, "cos")


def emit_tan(e: Emit, x: ir.Value) -> ir.Value:
    return emit_trig(e, x, "tan")
