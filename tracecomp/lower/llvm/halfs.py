"""bfloat16 and float16 in LLVM IR: i16 in memory, float32 in registers.

Widening is exact and narrowing rounds as core/halfs.py does (nearest even, NaN kept and
made quiet), on scalars or vectors alike (the packed matmul converts whole vectors).
bfloat16 uses integer ops and selects only: they vectorize on any x86-64 host, and the
instruction that would do it (AVX512-BF16's vcvtneps2bf16, LLVM's `fptrunc` to `bfloat`)
treats float32 subnormal inputs as zero, which eager mode does not (measured on Zen 4:
0x00018000 -> 0x0000 where ml_dtypes gives 0x0001; every mismatch of a sweep of 2^20
bit patterns was a subnormal or a NaN).  float16 uses F16C's vcvtph2ps / vcvtps2ph (LLVM's
`fpext`/`fptrunc` of `half`) where the target has F16C: the same bits (nearest even, NaN
made quiet keeping its top payload bits) for a quarter of the integer sequence's
instructions; without F16C, the integer sequence (LLVM would call __truncsfhf2 and
__extendhfsf2, which neither the JIT nor an exported .so may rely on).  NVPTX modules
(PTX) always take `fpext`/`fptrunc` (cvt.f32.f16, cvt.rn.f16.f32, on every sm): the PTX
must not depend on the exporting host's CPU.  A register value
of a half dtype is always exactly representable in it: loads widen, casts to a half
dtype round in place.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..hostcpu import host_target

I16, I32, F32, HALF = ir.IntType(16), ir.IntType(32), ir.FloatType(), ir.HalfType()


def _like(v: ir.Value, element: ir.Type) -> ir.Type:
    """`element`, or a vector of it as long as vector `v`."""
    return ir.VectorType(element, v.type.count) if isinstance(v.type, ir.VectorType) else element


def _k(v: ir.Value, element: ir.Type, value) -> ir.Constant:
    """The constant `value` of `element` type, splat when `v` is a vector."""
    t = _like(v, element)
    return ir.Constant(t, [value] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(t, value)


def has_f16c() -> bool:
    return host_target().has("f16c")


def _native_f16(b: ir.IRBuilder) -> bool:
    return b.module.triple.startswith("nvptx") or has_f16c()


def widen(b: ir.IRBuilder, bits: ir.Value, label: str) -> ir.Value:
    """float32 of the i16 `bits` (or vector of them) of a bfloat16 or float16."""
    if label == "float16" and _native_f16(b):
        return b.fpext(b.bitcast(bits, _like(bits, HALF)), _like(bits, F32))
    u = b.zext(bits, _like(bits, I32))

    def i(value):
        return _k(u, I32, value)
    if label == "bfloat16":
        return b.bitcast(b.shl(u, i(16)), _like(u, F32))
    # float16: move exponent and mantissa into place, rebias; infinities and NaN get the
    # top exponent (a NaN made quiet), subnormals are normalized by a float32 subtraction
    o = b.shl(b.and_(u, i(0x7FFF)), i(13))
    exponent = b.and_(o, i(0x7C00 << 13))
    o = b.add(o, i(112 << 23))
    special = b.add(o, i(112 << 23))
    is_nan = b.icmp_unsigned("!=", b.and_(u, i(0x3FF)), i(0))
    special = b.select(is_nan, b.or_(special, i(0x00400000)), special)
    tiny = b.fsub(b.bitcast(b.add(o, i(1 << 23)), _like(u, F32)), _k(u, F32, 2.0 ** -14))
    o = b.select(b.icmp_unsigned("==", exponent, i(0x7C00 << 13)), special, o)
    o = b.select(b.icmp_unsigned("==", exponent, i(0)), b.bitcast(tiny, _like(u, I32)), o)
    return b.bitcast(b.or_(o, b.shl(b.and_(u, i(0x8000)), i(16))), _like(u, F32))


def narrow(b: ir.IRBuilder, x: ir.Value, label: str) -> ir.Value:
    """The i16 bits of float32 `x` (or vector of them) rounded to bfloat16 or float16."""
    if label == "float16" and _native_f16(b):
        return b.bitcast(b.fptrunc(x, _like(x, HALF)), _like(x, I16))
    u = b.bitcast(x, _like(x, I32))

    def i(value):
        return _k(u, I32, value)
    if label == "bfloat16":
        odd = b.and_(b.lshr(u, i(16)), i(1))
        rounded = b.lshr(b.add(b.add(u, i(0x7FFF)), odd), i(16))
        quiet = b.or_(b.lshr(u, i(16)), i(0x40))
        return b.trunc(b.select(b.fcmp_unordered("uno", x, x), quiet, rounded), _like(u, I16))
    sign = b.and_(b.lshr(u, i(16)), i(0x8000))
    magnitude = b.and_(u, i(0x7FFFFFFF))
    half = _k(u, F32, 0.5)
    subnormal = b.sub(b.bitcast(b.fadd(b.bitcast(magnitude, _like(u, F32)), half), _like(u, I32)),
                      b.bitcast(half, _like(u, I32)))
    odd = b.and_(b.lshr(magnitude, i(13)), i(1))
    normal = b.lshr(b.add(b.add(b.sub(magnitude, i(112 << 23)), i(0xFFF)), odd), i(13))
    nan = b.or_(i(0x7E00), b.and_(b.lshr(magnitude, i(13)), i(0x3FF)))
    bits = b.select(b.icmp_unsigned("<", magnitude, i(113 << 23)), subnormal, normal)
    bits = b.select(b.icmp_unsigned(">=", magnitude, i(143 << 23)), i(0x7C00), bits)
    bits = b.select(b.icmp_unsigned(">", magnitude, i(0x7F800000)), nan, bits)
    return b.trunc(b.or_(bits, sign), _like(u, I16))


def round_in_register(b: ir.IRBuilder, x: ir.Value, label: str) -> ir.Value:
    """float32 `x` rounded to bfloat16 or float16 and widened back (a cast's value)."""
    return widen(b, narrow(b, x, label), label)
