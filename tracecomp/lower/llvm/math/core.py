"""IR-building vocabulary shared by the math emitters in llvm_math_*.py.

`Emit` wraps an llvmlite IRBuilder with one float format (f32 or f64) and offers the
operations the algorithms are written in: arithmetic on Python numbers or IR values,
fused multiply-add, ordered comparisons, selects, bit casts, polynomial evaluation and
scaling by powers of two. Everything it emits is straight-line code (selects, never
branches) built from instructions and intrinsics that LLVM's vectorizers widen:
fma, fabs, copysign, rint, fshl, integer shifts by constants or by lane values.

Nothing here uses fast-math flags: the algorithms rely on exact IEEE rounding (error-free
transformations, Sterbenz subtraction), which fast-math would be free to break.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from llvmlite import ir

from ... import hostcpu

Value = Union[ir.Value, float, int]


@dataclass(frozen=True)
class Fmt:
    """A binary floating-point format and its same-width integer type."""
    name: str
    bits: int
    mant: int      # explicit significand bits (23, 52)
    bias: int      # exponent bias (127, 1023)

    @property
    def ftype(self) -> ir.Type:
        return ir.FloatType() if self.bits == 32 else ir.DoubleType()

    @property
    def itype(self) -> ir.IntType:
        return ir.IntType(self.bits)

    @property
    def prec(self) -> int:
        return self.mant + 1

    @property
    def emax(self) -> int:
        return self.bias

    @property
    def exp_mask(self) -> int:
        return ((1 << (self.bits - 1 - self.mant)) - 1) << self.mant

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)


F32 = Fmt("f32", 32, 23, 127)
F64 = Fmt("f64", 64, 52, 1023)
FORMATS = {"f32": F32, "f64": F64}


class Emit:
    """Builds straight-line float code of one format at the builder's position."""

    def __init__(self, builder: ir.IRBuilder, fmt: Fmt):
        self.b = builder
        self.fmt = fmt
        self.module: ir.Module = builder.module

    def other(self, fmt: Fmt) -> "Emit":
        """The same builder for another float format (f32 kernels computed in double)."""
        return Emit(self.b, fmt)

    # ---------------------------------------------------------------- constants
    def c(self, v: Value) -> ir.Value:
        return v if isinstance(v, ir.Value) else ir.Constant(self.fmt.ftype, float(v))

    def ci(self, v: Value, bits: int | None = None) -> ir.Value:
        if isinstance(v, ir.Value):
            return v
        t = ir.IntType(bits or self.fmt.bits)
        return ir.Constant(t, int(v) & ((1 << t.width) - 1))

    # ---------------------------------------------------------------- float arithmetic
    def add(self, a: Value, b: Value) -> ir.Value:
        return self.b.fadd(self.c(a), self.c(b))

    def sub(self, a: Value, b: Value) -> ir.Value:
        return self.b.fsub(self.c(a), self.c(b))

    def mul(self, a: Value, b: Value) -> ir.Value:
        return self.b.fmul(self.c(a), self.c(b))

    def div(self, a: Value, b: Value) -> ir.Value:
        return self.b.fdiv(self.c(a), self.c(b))

    def neg(self, a: Value) -> ir.Value:
        return self.b.fneg(self.c(a))

    def _intrinsic(self, name: str, args: Sequence[ir.Value], ret: ir.Type | None = None) -> ir.Value:
        """Call llvm.NAME.<suffix>, declaring it on first use (overloaded on the first arg type)."""
        t = args[0].type
        suffix = {ir.FloatType: "f32", ir.DoubleType: "f64"}.get(type(t)) or f"i{t.width}"
        full = f"llvm.{name}.{suffix}"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret or t, [a.type for a in args]), full)
        return self.b.call(fn, list(args))

    def fma(self, a: Value, b: Value, c: Value) -> ir.Value:
        """a*b + c with one rounding."""
        return self._intrinsic("fma", [self.c(a), self.c(b), self.c(c)])

    def abs(self, a: Value) -> ir.Value:
        return self._intrinsic("fabs", [self.c(a)])

    def copysign(self, mag: Value, sign: Value) -> ir.Value:
        return self._intrinsic("copysign", [self.c(mag), self.c(sign)])

    def floor(self, a: Value) -> ir.Value:
        return self._intrinsic("floor", [self.c(a)])

    def rint(self, a: Value) -> ir.Value:
        """Round to nearest integer, ties to even (default rounding mode)."""
        return self._intrinsic("rint", [self.c(a)])

    # ---------------------------------------------------------------- comparisons, selects
    def cmp(self, op: str, a: Value, b: Value) -> ir.Value:
        """Ordered comparison: false when either side is NaN."""
        return self.b.fcmp_ordered(op, self.c(a), self.c(b))

    def isnan(self, a: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", a, a)

    def isinf(self, a: ir.Value) -> ir.Value:
        return self.cmp("==", self.abs(a), float("inf"))

    def select(self, cond: ir.Value, a: Value, b: Value) -> ir.Value:
        a, b = (self.c(v) if not isinstance(v, ir.Value) else v for v in (a, b))
        return self.b.select(cond, a, b)

    def and_(self, *conds: ir.Value) -> ir.Value:
        out = conds[0]
        for c in conds[1:]:
            out = self.b.and_(out, c)
        return out

    def or_(self, *conds: ir.Value) -> ir.Value:
        out = conds[0]
        for c in conds[1:]:
            out = self.b.or_(out, c)
        return out

    def not_(self, cond: ir.Value) -> ir.Value:
        return self.b.not_(cond)

    def min(self, a: Value, b: Value) -> ir.Value:
        """a < b ? a : b (returns b when either is NaN)."""
        return self.select(self.cmp("<", a, b), a, b)

    def max(self, a: Value, b: Value) -> ir.Value:
        return self.select(self.cmp(">", a, b), a, b)

    # ---------------------------------------------------------------- bits and integers
    def bits(self, a: ir.Value) -> ir.Value:
        return self.b.bitcast(a, self.fmt.itype)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.fmt.ftype)

    def iadd(self, a: Value, b: Value) -> ir.Value:
        a = self.ci(a, b.type.width if isinstance(b, ir.Value) else None)
        return self.b.add(a, self.ci(b, a.type.width))

    def isub(self, a: Value, b: Value) -> ir.Value:
        a = self.ci(a, b.type.width if isinstance(b, ir.Value) else None)
        return self.b.sub(a, self.ci(b, a.type.width))

    def imul(self, a: ir.Value, b: Value) -> ir.Value:
        return self.b.mul(a, self.ci(b, a.type.width))

    def iand(self, a: ir.Value, b: Value) -> ir.Value:
        return self.b.and_(a, self.ci(b, a.type.width))

    def ior(self, a: ir.Value, b: Value) -> ir.Value:
        return self.b.or_(a, self.ci(b, a.type.width))

    def ixor(self, a: ir.Value, b: Value) -> ir.Value:
        return self.b.xor(a, self.ci(b, a.type.width))

    def shl(self, a: ir.Value, n: Value) -> ir.Value:
        return self.b.shl(a, self.ci(n, a.type.width))

    def ashr(self, a: ir.Value, n: Value) -> ir.Value:
        return self.b.ashr(a, self.ci(n, a.type.width))

    def lshr(self, a: ir.Value, n: Value) -> ir.Value:
        return self.b.lshr(a, self.ci(n, a.type.width))

    def icmp(self, op: str, a: ir.Value, b: Value, signed: bool = True) -> ir.Value:
        f = self.b.icmp_signed if signed else self.b.icmp_unsigned
        return f(op, a, self.ci(b, a.type.width))

    def iselect(self, cond: ir.Value, a: Value, b: Value, bits: int | None = None) -> ir.Value:
        w = bits or (a.type.width if isinstance(a, ir.Value) else b.type.width if isinstance(b, ir.Value) else None)
        return self.b.select(cond, self.ci(a, w), self.ci(b, w))

    def fshl(self, hi: ir.Value, lo: ir.Value, n: ir.Value) -> ir.Value:
        """(hi:lo << n) >> width, n taken modulo the width (no poison for n = 0)."""
        return self._intrinsic("fshl", [hi, lo, n])

    # Conversions between double and i64 exist as vector instructions only with AVX-512DQ;
    # elsewhere (AVX2) LLVM did them one lane at a time (f32 sin took 2.7x its AVX-512
    # time, f64 exp 1.8x).  There they go by the magic number M = 1.5 * 2^mant: for an
    # integer |v| < 2^(mant-1), M + v is exact and its bit pattern is bits(M) + v: two vector
    # instructions, and exactly fptosi's/sitofp's results.  Float32 <-> i32 is native on
    # every x86 target.
    def _native(self) -> bool:
        return self.fmt.bits == 32 or hostcpu.host_target().has("avx512dq")

    def _magic(self) -> float:
        return 1.5 * 2.0 ** self.fmt.mant

    def to_int(self, a: ir.Value, bits: int | None = None) -> ir.Value:
        """The integer value of an integral float a with |a| < 2^(mant-1) (as the format's
        integer type, or `bits` wide)."""
        if self._native():
            return self.b.fptosi(a, ir.IntType(bits or self.fmt.bits))
        i = self.isub(self.bits(self.add(a, self._magic())), self.bits(self.c(self._magic())))
        return self.sext(i, bits) if bits else i

    def to_float(self, i: ir.Value) -> ir.Value:
        """The float of an integer |i| < 2^(mant-1) (exact)."""
        if self._native():
            return self.b.sitofp(i, self.fmt.ftype)
        i = self.sext(i, self.fmt.bits)
        return self.sub(self.from_bits(self.iadd(i, self.bits(self.c(self._magic())))), self._magic())

    def to_float_wide(self, i: ir.Value) -> ir.Value:
        """The double nearest a 64-bit integer |i| < 2^62 (rounded once, as sitofp):
        hi 2^32 + lo with both halves converted exactly, then one fma."""
        if self._native():
            return self.b.sitofp(i, self.fmt.ftype)
        hi = self.to_float(self.ashr(i, 32))
        lo = self.to_float(self.iand(i, 0xFFFFFFFF))
        return self.fma(hi, 2.0 ** 32, lo)

    def to_int_wide(self, a: ir.Value) -> ir.Value:
        """The 64-bit integer value of an integral double |a| < 2^62: hi 2^32 + lo, both
        halves exact (floor of a power-of-two multiple, and the remainder)."""
        if self._native():
            return self.b.fptosi(a, ir.IntType(64))
        hi = self.floor(self.mul(a, 2.0 ** -32))
        lo = self.fma(hi, -(2.0 ** 32), a)
        return self.iadd(self.shl(self.to_int(hi), 32), self.to_int(lo))

    def sext(self, i: ir.Value, bits: int) -> ir.Value:
        return self.b.sext(i, ir.IntType(bits)) if i.type.width < bits else i

    def zext(self, i: ir.Value, bits: int) -> ir.Value:
        return self.b.zext(i, ir.IntType(bits)) if i.type.width < bits else i

    def trunc(self, i: ir.Value, bits: int) -> ir.Value:
        return self.b.trunc(i, ir.IntType(bits)) if i.type.width > bits else i

    def convert(self, a: ir.Value, fmt: Fmt) -> ir.Value:
        """fpext / fptrunc between f32 and f64 (rounds to nearest)."""
        if fmt.bits == self.fmt.bits:
            return a
        return self.b.fpext(a, fmt.ftype) if fmt.bits > self.fmt.bits else self.b.fptrunc(a, fmt.ftype)

    # ---------------------------------------------------------------- composite helpers
    def poly(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """sum c_i x^i by Horner's rule with fma (coefficients lowest power first)."""
        acc = self.c(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, c)
        return acc

    def pow2i(self, k: ir.Value) -> ir.Value:
        """2**k for an integer k (format's int type) in the normal exponent range."""
        return self.from_bits(self.shl(self.iadd(k, self.fmt.bias), self.fmt.mant))

    def scale(self, x: ir.Value, k: ir.Value) -> ir.Value:
        """x * 2**k for |k| up to about 2*emax, in two steps so that results in the
        subnormal range are rounded once and overflow gives inf (ldexp without branches)."""
        k1 = self.ashr(k, 1)
        k2 = self.isub(k, k1)
        return self.mul(self.mul(x, self.pow2i(k1)), self.pow2i(k2))

    def two_sum(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """s + e == a + b exactly, s = fl(a + b) (Knuth; no ordering needed)."""
        s = self.add(a, b)
        bb = self.sub(s, a)
        e = self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))
        return s, e

    def fast_two_sum(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """As two_sum, valid when |a| >= |b| (or a's exponent >= b's)."""
        s = self.add(a, b)
        return s, self.sub(b, self.sub(s, a))

    def two_prod(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """p + e == a * b exactly (barring underflow)."""
        p = self.mul(a, b)
        return p, self.fma(a, b, self.neg(p))

    def finish(self, x: ir.Value, result: ir.Value, cases: Sequence[tuple[ir.Value, Value]]) -> ir.Value:
        """Apply special cases in order of increasing priority (last one wins)."""
        for cond, val in cases:
            result = self.select(cond, val, result)
        return result
