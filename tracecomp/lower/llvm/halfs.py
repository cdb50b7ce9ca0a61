"""bfloat16 and float16 in LLVM IR: i16 in memory, float32 in registers.

Widening is exact and narrowing rounds as core/halfs.py does (nearest even, NaN kept and
made quiet), both with integer ops and selects only: they vectorize on any x86-64 host
and need no runtime library (LLVM's `bfloat`/`half` conversions become libcalls such as
__truncsfbf2 where the host lacks the instructions, which neither the JIT nor an exported
.so may rely on).  A register value of a half dtype is always exactly representable in
it: loads widen, casts to a half dtype round in place.
"""
from __future__ import annotations

import llvmlite.ir as ir

I16, I32, F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()


def _i32(value: int) -> ir.Constant:
    return ir.Constant(I32, value)


def widen(b: ir.IRBuilder, bits: ir.Value, label: str) -> ir.Value:
    """float32 of the i16 `bits` of a bfloat16 or float16."""
    u = b.zext(bits, I32)
    if label == "bfloat16":
        return b.bitcast(b.shl(u, _i32(16)), F32)
    # float16: move exponent and mantissa into place, rebias; infinities and NaN get the
    # top exponent (a NaN made quiet), subnormals are normalized by a float32 subtraction
    o = b.shl(b.and_(u, _i32(0x7FFF)), _i32(13))
    exponent = b.and_(o, _i32(0x7C00 << 13))
    o = b.add(o, _i32(112 << 23))
    special = b.add(o, _i32(112 << 23))
    is_nan = b.icmp_unsigned("!=", b.and_(u, _i32(0x3FF)), _i32(0))
    special = b.select(is_nan, b.or_(special, _i32(0x00400000)), special)
    tiny = b.fsub(b.bitcast(b.add(o, _i32(1 << 23)), F32), ir.Constant(F32, 2.0 ** -14))
    o = b.select(b.icmp_unsigned("==", exponent, _i32(0x7C00 << 13)), special, o)
    o = b.select(b.icmp_unsigned("==", exponent, _i32(0)), b.bitcast(tiny, I32), o)
    return b.bitcast(b.or_(o, b.shl(b.and_(u, _i32(0x8000)), _i32(16))), F32)


def narrow(b: ir.IRBuilder, x: ir.Value, label: str) -> ir.Value:
    """The i16 bits of float32 `x` rounded to bfloat16 or float16."""
    u = b.bitcast(x, I32)
    if label == "bfloat16":
        odd = b.and_(b.lshr(u, _i32(16)), _i32(1))
        rounded = b.lshr(b.add(b.add(u, _i32(0x7FFF)), odd), _i32(16))
        quiet = b.or_(b.lshr(u, _i32(16)), _i32(0x40))
        return b.trunc(b.select(b.fcmp_unordered("uno", x, x), quiet, rounded), I16)
    sign = b.and_(b.lshr(u, _i32(16)), _i32(0x8000))
    magnitude = b.and_(u, _i32(0x7FFFFFFF))
    half = ir.Constant(F32, 0.5)
    subnormal = b.sub(b.bitcast(b.fadd(b.bitcast(magnitude, F32), half), I32), b.bitcast(half, I32))
    odd = b.and_(b.lshr(magnitude, _i32(13)), _i32(1))
    normal = b.lshr(b.add(b.add(b.sub(magnitude, _i32(112 << 23)), _i32(0xFFF)), odd), _i32(13))
    nan = b.or_(_i32(0x7E00), b.and_(b.lshr(magnitude, _i32(13)), _i32(0x3FF)))
    bits = b.select(b.icmp_unsigned("<", magnitude, _i32(113 << 23)), subnormal, normal)
    bits = b.select(b.icmp_unsigned(">=", magnitude, _i32(143 << 23)), _i32(0x7C00), bits)
    bits = b.select(b.icmp_unsigned(">", magnitude, _i32(0x7F800000)), nan, bits)
    return b.trunc(b.or_(bits, sign), I16)


def round_in_register(b: ir.IRBuilder, x: ir.Value, label: str) -> ir.Value:
    """float32 `x` rounded to bfloat16 or float16 and widened back (a cast's value)."""
    return widen(b, narrow(b, x, label), label)
