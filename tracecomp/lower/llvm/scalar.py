"""Loop-IR scalars in LLVM IR: types, constants, and every Unary/Binary fn and Cast.

The semantics are loops/interp.py's (NumPy's), as the loop-IR printer documents them:
integer `div` truncates, `floordiv`/`mod` floor (Python's // and %; the remainder takes the
divisor's sign) and `fmod` truncates (C's fmod: the dividend's sign); integer division by zero gives 0 and INT_MIN / -1 wraps instead of
trapping; float `floordiv`/`mod` follow NumPy's divmod exactly (inf/NaN cases included);
`maximum`/`minimum` propagate NaN; `ne` on floats is unordered (true for NaN), the other
comparisons ordered; bools compare unsigned, add/maximum are `or`, mul/minimum `and`;
`round` is half-to-even; `sign` keeps 0 and -0, and gives 0 for NaN (PyTorch); floor/ceil/
round of integers and sign of bools are the identity; a Cast to bool is `!= 0` (NaN -> true).
Two choices go beyond NumPy, where C leaves the result undefined: a float -> int cast
truncates, and NaN, infinities and out-of-range values give INT_MIN, as x86 (and so PyTorch
there) does, on every host (dtypes.cast_array states the same rule for the eager kernels;
never LLVM's poison); an integer `pow` with a negative exponent is 1 / a**-b truncated (1 for
a == 1, +-1 for a == -1, else 0) where NumPy raises.

Representation: bool is i1 in registers and i8 in memory; index is i64; bfloat16 and
float16 are float32 in registers and i16 in memory (llvm/halfs.py), every arithmetic
result of theirs rounded back at once, as NumPy with ml_dtypes computes them.  Integer
arithmetic on user data wraps (no nsw: overflow is defined, like NumPy's); arithmetic on
`index` values is nsw, which lets LLVM reason about addresses.  Transcendentals go through
`math_function`, the one place that picks between llvm/math's vectorizable polynomials
and LLVM intrinsics / libm.
"""
from __future__ import annotations

from typing import Callable, Union

import llvmlite.ir as ir
import numpy as np

from ...core.dtypes import DType, cast_array
from ...core.errors import BackendError
from ..loops.ir import INDEX
from . import halfs

DTypeLike = Union[DType, str]
I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
_REGISTER = {DType.bool: I1, DType.int32: I32, DType.int64: I64, DType.float32: F32,
             DType.float64: F64, DType.bfloat16: F32, DType.float16: F32, INDEX: I64}
MATH_FUNCTIONS = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh",
                  "erf", "pow", "atan2")
_INTRINSIC_MATH = ("exp", "exp2", "log", "log2", "sin", "cos", "tan", "tanh", "pow", "atan2")


def kind(dtype: DTypeLike) -> str:
    """'f' float, 'i' integer, 'x' index, 'b' bool (loops/check.py's kinds)."""
    if dtype == INDEX:
        return "x"
    return "b" if dtype is DType.bool else "f" if dtype.is_floating_point else "i"


def register_type(dtype: DTypeLike) -> ir.Type:
    return _REGISTER[dtype]


def is_half(dtype: DTypeLike) -> bool:
    return isinstance(dtype, DType) and dtype.is_half


def memory_type(dtype: DTypeLike) -> ir.Type:
    """How a buffer stores the dtype: bool takes a byte, as in NumPy; half types their bits."""
    return I8 if dtype is DType.bool else I16 if is_half(dtype) else _REGISTER[dtype]


def constant(value, dtype: DTypeLike) -> ir.Constant:
    if is_half(dtype):        # the value the dtype holds, rounded as a cast rounds it
        value = float(cast_array(np.asarray(float(value), np.float64), dtype.np).astype(np.float32))
    if kind(dtype) == "f":
        return ir.Constant(_REGISTER[dtype], float(value))
    return ir.Constant(_REGISTER[dtype], int(value))


def load_value(b: ir.IRBuilder, ptr: ir.Value, dtype: DTypeLike) -> ir.Value:
    """An element from memory as a register value (bool: any nonzero byte is true)."""
    v = b.load(ptr, typ=memory_type(dtype), align=dtype.itemsize)
    if is_half(dtype):
        return halfs.widen(b, v, dtype.label)
    return b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if dtype is DType.bool else v


def store_value(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, dtype: DTypeLike) -> None:
    if dtype is DType.bool:
        v = b.zext(v, I8)
    elif is_half(dtype):
        v = halfs.narrow(b, v, dtype.label)
    b.store(v, ptr, align=dtype.itemsize)


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type],
            attrs: tuple[str, ...] = ()) -> ir.Function:
    """The function `name` of `module`, declared on first use."""
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, args), name)
        for a in attrs:
            fn.attributes.add(a)
    return fn


def intrinsic(b: ir.IRBuilder, name: str, args: list[ir.Value], extra: tuple = ()) -> ir.Value:
    """Call LLVM intrinsic `llvm.<name>` overloaded on the first argument's type."""
    t = args[0].type
    suffix = {F32: "f32", F64: "f64"}.get(t) or f"i{t.width}"
    fn = declare(b.module, f"llvm.{name}.{suffix}", t, [a.type for a in args] + [e.type for e in extra])
    return b.call(fn, list(args) + list(extra))


# ---------------------------------------------------------------- math functions

def math_function(module: ir.Module, name: str, dtype: DTypeLike) -> ir.Function:
    """`name` (exp, log, pow, atan2, ...) on f32/f64 as a function of `module`.

    The vectorizable polynomial of llvm/math when it has one, else an LLVM intrinsic, else
    libm.  Intrinsics and libm calls are correct but become scalar libm calls inside
    vectorized loops."""
    suffix = {DType.float32: "f32", DType.float64: "f64"}[dtype.compute]
    if name not in MATH_FUNCTIONS:
        raise BackendError(f"no math function '{name}' (known: {', '.join(MATH_FUNCTIONS)})")
    try:
        return _polynomials().get_math_function(module, name, suffix)
    except (LookupError, NotImplementedError):
        return _fallback_math_function(module, name, dtype)      # no polynomial for this one


def _polynomials():
    from .math import functions      # imported on first use: a large module
    return functions


def _fallback_math_function(module: ir.Module, name: str, dtype: DTypeLike) -> ir.Function:
    t = _REGISTER[dtype]
    nargs = 2 if name in ("pow", "atan2") else 1
    if name in _INTRINSIC_MATH:
        return declare(module, f"llvm.{name}.{'f32' if t == F32 else 'f64'}", t, [t] * nargs)
    libm = name + ("f" if t == F32 else "")          # expm1f, log1pf, erff
    # readnone: pure of memory (errno aside), so loops that call it may still be optimized.
    return declare(module, libm, t, [t] * nargs, attrs=("nounwind", "readnone"))


# ---------------------------------------------------------------- unary

def _float_sign(b, x, t):
    one, zero = constant(1.0, t), constant(0.0, t)
    rest = b.select(b.fcmp_ordered("==", x, zero), x, zero)        # 0 and -0 stay, NaN -> 0
    neg = b.select(b.fcmp_ordered("<", x, zero), constant(-1.0, t), rest)
    return b.select(b.fcmp_ordered(">", x, zero), one, neg)


def _int_sign(b, x, t):
    zero = constant(0, t)
    return b.sub(b.zext(b.icmp_signed(">", x, zero), x.type), b.zext(b.icmp_signed("<", x, zero), x.type))


def _math(name):
    return lambda b, x, t: b.call(math_function(b.module, name, t), [x])


def _identity(b, x, t):
    return x


UNARY: dict[str, dict[str, Callable]] = {
    "f": {"neg": lambda b, x, t: b.fneg(x), "abs": lambda b, x, t: intrinsic(b, "fabs", [x]),
          "sign": _float_sign, "sqrt": lambda b, x, t: intrinsic(b, "sqrt", [x]),
          "rsqrt": lambda b, x, t: b.fdiv(constant(1.0, t), intrinsic(b, "sqrt", [x])),
          "floor": lambda b, x, t: intrinsic(b, "floor", [x]),
          "ceil": lambda b, x, t: intrinsic(b, "ceil", [x]),
          "round": lambda b, x, t: intrinsic(b, "roundeven", [x]),
          **{fn: _math(fn) for fn in MATH_FUNCTIONS if fn not in ("pow", "atan2")}},
    "i": {"neg": lambda b, x, t: b.sub(constant(0, t), x),
          "abs": lambda b, x, t: intrinsic(b, "abs", [x], (ir.Constant(I1, 0),)),
          "sign": _int_sign, "floor": _identity, "ceil": _identity, "round": _identity},
    "b": {"sign": _identity, "not": lambda b, x, t: b.xor(x, ir.Constant(I1, 1)),
          "logical_not": lambda b, x, t: b.xor(x, ir.Constant(I1, 1))},
}


def unary(b: ir.IRBuilder, fn: str, x: ir.Value, dtype: DTypeLike) -> ir.Value:
    rule = UNARY.get(kind(dtype), {}).get(fn)
    if rule is None:
        raise BackendError(f"the LLVM backend has no Unary '{fn}' for {dtype}")
    return _rounded(b, rule(b, x, dtype), dtype)


def _rounded(b: ir.IRBuilder, v: ir.Value, dtype: DTypeLike) -> ir.Value:
    """A half dtype's float32 result rounded to it (comparisons' bools pass)."""
    return halfs.round_in_register(b, v, dtype.label) if is_half(dtype) and v.type == F32 else v


# ---------------------------------------------------------------- binary

def _float_divmod(b, x, y, t):
    """NumPy's npy_divmod: (floor quotient, remainder with the divisor's sign)."""
    zero, one = constant(0.0, t), constant(1.0, t)
    mod = b.frem(x, y)
    div = b.fdiv(b.fsub(x, mod), y)
    mod_nonzero = b.fcmp_unordered("!=", mod, zero)           # NaN counts as nonzero, as in C
    signs_differ = b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", mod, zero))
    fix = b.and_(mod_nonzero, signs_differ)
    mod = b.select(fix, b.fadd(mod, y), mod)
    div = b.select(fix, b.fsub(div, one), div)
    mod = b.select(mod_nonzero, mod, intrinsic(b, "copysign", [zero, y]))
    floor = intrinsic(b, "floor", [div])
    floor = b.select(b.fcmp_ordered(">", b.fsub(div, floor), constant(0.5, t)), b.fadd(floor, one), floor)
    quotient = b.fdiv(x, y)
    floordiv = b.select(b.fcmp_unordered("!=", div, zero), floor, intrinsic(b, "copysign", [zero, quotient]))
    y_zero = b.fcmp_ordered("==", y, zero)
    return b.select(y_zero, quotient, floordiv), b.select(y_zero, b.frem(x, y), mod)


def _int_divmod(b, x, y, t, floored: bool):
    """(quotient, remainder), truncated or floored; y == 0 gives (0, 0), y == -1 wraps."""
    zero, one = constant(0, t), constant(1, t)
    y_zero, y_minus1 = b.icmp_signed("==", y, zero), b.icmp_signed("==", y, constant(-1, t))
    safe = b.select(b.or_(y_zero, y_minus1), one, y)          # sdiv traps on 0 and INT_MIN / -1
    q, r = b.sdiv(x, safe), b.srem(x, safe)
    if floored:
        fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
        q = b.sub(q, b.zext(fix, x.type))
        r = b.add(r, b.select(fix, safe, zero))
    q = b.select(y_minus1, b.sub(zero, x), q)
    return b.select(y_zero, zero, q), b.select(y_zero, zero, r)


def _int_pow(b, x, y, t):
    """x ** y by squaring in a helper function (one per integer type)."""
    return b.call(_ipow_function(b.module, x.type), [x, y])


def _ipow_function(module: ir.Module, t: ir.IntType) -> ir.Function:
    name = f"tracecomp.ipow.i{t.width}"
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, ir.FunctionType(t, [t, t]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    base, exp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    loop, done = fn.append_basic_block("loop"), fn.append_basic_block("done")
    # Negative exponent: 1 / x**-y truncated: 1 for x == 1, (-1)**y for x == -1, else 0.
    minus_one = b.select(b.trunc(exp, I1), ir.Constant(t, -1), one)
    tiny = b.select(b.icmp_signed("==", base, one), one,
                    b.select(b.icmp_signed("==", base, ir.Constant(t, -1)), minus_one, zero))
    early = b.select(b.icmp_signed("==", exp, zero), one, tiny)      # x**0 == 1
    entry = b.block
    b.cbranch(b.icmp_signed("<=", exp, zero), done, loop)
    b.position_at_end(loop)
    acc, sq, e = b.phi(t), b.phi(t), b.phi(t)
    acc2 = b.select(b.trunc(e, I1), b.mul(acc, sq), acc)
    sq2, e2 = b.mul(sq, sq), b.ashr(e, one)
    for phi, init, nxt in ((acc, one, acc2), (sq, base, sq2), (e, exp, e2)):
        phi.add_incoming(init, entry)
        phi.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("==", e2, zero), done, loop)
    b.position_at_end(done)
    result = b.phi(t)
    result.add_incoming(early, entry)
    result.add_incoming(acc2, loop)
    b.ret(result)
    return fn


_FCMP = {"eq": ("==", True), "ne": ("!=", False), "lt": ("<", True), "le": ("<=", True),
         "gt": (">", True), "ge": (">=", True)}
_ICMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _fcmp(op):
    pred, ordered = _FCMP[op]
    return lambda b, x, y, t: (b.fcmp_ordered if ordered else b.fcmp_unordered)(pred, x, y)


def _index_flags(t):
    return ("nsw",) if t == INDEX else ()


BINARY: dict[str, dict[str, Callable]] = {
    "f": {"add": lambda b, x, y, t: b.fadd(x, y), "sub": lambda b, x, y, t: b.fsub(x, y),
          "mul": lambda b, x, y, t: b.fmul(x, y), "div": lambda b, x, y, t: b.fdiv(x, y),
          "pow": lambda b, x, y, t: b.call(math_function(b.module, "pow", t), [x, y]),
          "atan2": lambda b, x, y, t: b.call(math_function(b.module, "atan2", t), [x, y]),
          "maximum": lambda b, x, y, t: intrinsic(b, "maximum", [x, y]),
          "minimum": lambda b, x, y, t: intrinsic(b, "minimum", [x, y]),
          "floordiv": lambda b, x, y, t: _float_divmod(b, x, y, t)[0],
          "mod": lambda b, x, y, t: _float_divmod(b, x, y, t)[1],
          "fmod": lambda b, x, y, t: b.frem(x, y),
          **{op: _fcmp(op) for op in _FCMP}},
    "i": {"add": lambda b, x, y, t: b.add(x, y, flags=_index_flags(t)),
          "sub": lambda b, x, y, t: b.sub(x, y, flags=_index_flags(t)),
          "mul": lambda b, x, y, t: b.mul(x, y, flags=_index_flags(t)),
          "div": lambda b, x, y, t: _int_divmod(b, x, y, t, floored=False)[0],
          "floordiv": lambda b, x, y, t: _int_divmod(b, x, y, t, floored=True)[0],
          "mod": lambda b, x, y, t: _int_divmod(b, x, y, t, floored=True)[1],
          "fmod": lambda b, x, y, t: _int_divmod(b, x, y, t, floored=False)[1],
          "and": lambda b, x, y, t: b.and_(x, y), "or": lambda b, x, y, t: b.or_(x, y),
          "xor": lambda b, x, y, t: b.xor(x, y),
          "pow": _int_pow,
          "maximum": lambda b, x, y, t: intrinsic(b, "smax", [x, y]),
          "minimum": lambda b, x, y, t: intrinsic(b, "smin", [x, y]),
          **{op: (lambda pred: lambda b, x, y, t: b.icmp_signed(pred, x, y))(p) for op, p in _ICMP.items()}},
    "b": {"add": lambda b, x, y, t: b.or_(x, y), "or": lambda b, x, y, t: b.or_(x, y),
          "maximum": lambda b, x, y, t: b.or_(x, y), "mul": lambda b, x, y, t: b.and_(x, y),
          "and": lambda b, x, y, t: b.and_(x, y), "minimum": lambda b, x, y, t: b.and_(x, y),
          "xor": lambda b, x, y, t: b.xor(x, y),
          **{op: (lambda pred: lambda b, x, y, t: b.icmp_unsigned(pred, x, y))(p) for op, p in _ICMP.items()}},
}
BINARY["x"] = {fn: BINARY["i"][fn] for fn in ("add", "sub", "mul", "floordiv", "mod", "maximum",
                                               "minimum", *_ICMP)}


def binary(b: ir.IRBuilder, fn: str, x: ir.Value, y: ir.Value, dtype: DTypeLike) -> ir.Value:
    """`fn` of two operands of `dtype` (the result is bool for comparisons)."""
    rule = BINARY.get(kind(dtype), {}).get(fn)
    if rule is None:
        raise BackendError(f"the LLVM backend has no Binary '{fn}' for {dtype}")
    return _rounded(b, rule(b, x, y, dtype), dtype)


# ---------------------------------------------------------------- casts

def cast(b: ir.IRBuilder, x: ir.Value, src: DTypeLike, dst: DTypeLike) -> ir.Value:
    """Convert a register value of dtype `src` to `dst` (see the module docstring)."""
    if src == dst:
        return x
    if is_half(dst):           # through float32 (twice rounded from float64, as PyTorch does)
        return halfs.round_in_register(b, cast(b, x, src, DType.float32), dst.label)
    if is_half(src):           # its register already is the exact float32
        return cast(b, x, DType.float32, dst)
    s, d, to = kind(src), kind(dst), _REGISTER[dst]
    if d == "b":
        if s == "f":
            return b.fcmp_unordered("!=", x, constant(0.0, src))
        return b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
    if s == "b":
        return b.uitofp(x, to) if d == "f" else b.zext(x, to)
    if s == "f" and d == "f":
        return b.fpext(x, to) if to == F64 else b.fptrunc(x, to)
    if s == "f":      # fptosi of NaN or an out-of-range value is poison: convert only valid ones
        low = ir.Constant(x.type, -float(2 ** (to.width - 1)))
        valid = b.and_(b.fcmp_ordered(">=", x, low), b.fcmp_ordered("<", x, ir.Constant(x.type, float(2 ** (to.width - 1)))))
        converted = b.fptosi(b.select(valid, x, ir.Constant(x.type, 0.0)), to)
        return b.select(valid, converted, ir.Constant(to, -(2 ** (to.width - 1))))
    if d == "f":
        return b.sitofp(x, to)
    if to.width > x.type.width:
        return b.sext(x, to)
    return b.trunc(x, to) if to.width < x.type.width else x

