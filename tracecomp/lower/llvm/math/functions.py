"""Vectorizable scalar math functions in LLVM IR, for float32 and float64.

`get_math_function(module, name, dtype)` defines `tc.<name>.<dtype>` (e.g. `tc.exp.f32`)
in an llvmlite module on first use and returns it; the code generator calls it from loop
bodies. Each function is straight-line code (selects, no branches, no libm calls, no
memory access: tables are a handful of constants picked by selects), has internal
linkage and is `alwaysinline`, so after inlining LLVM's loop vectorizer widens it like
any arithmetic. The algorithms (range reduction, minimax polynomials from
`tools/llvm_math_fit.py`, special cases) are described in the modules of this folder:
exp (exp, exp2, expm1, tanh, sigmoid), log (log, log2, log1p), trig (sin, cos, tan),
special (erf, atan, atan2, pow). Special values follow C99 Annex F: NaN propagates,
+-inf and +-0 as in C (sin(-0) = -0, expm1(-0) = -0, pow(x, 0) = 1, ...), subnormal
inputs and results are computed, not flushed.

The algorithms need IEEE semantics where they are inlined: callers must not put fast-math
flags on these instructions or "unsafe-fp-math"/"no-nans-fp-math" attributes on the
calling function, and subnormal results assume the CPU does not flush to zero (FTZ/DAZ).

Measured accuracy, max error in ulps (tests/lower/test_llvm_math.py; `python
tests/lower/test_llvm_math.py --big` reprints it). f32: distance in ulps from numpy's float64
result rounded to float32 (so 0 = correctly rounded at every point tried), over every
257th float32 bit pattern (16.7 M points covering the whole range, subnormals, inf, NaN)
plus special and boundary values. Every one-argument f32 function but erf was also run
over all 2^32 float32 inputs, with the same maxima as in the table.
f64: |error| / ulp against long-double libm (a long-double series for erf), over 2 M
points: 1 M random bit patterns (log-uniform over the whole range) and 1 M uniform in
[-10, 10] and [-1, 1], plus special values; pow and atan2: 4 M / 2 M pairs (moderate,
near-1 bases with large exponents, negative bases with integer exponents, results near
overflow and underflow, every special pair).

    function  f32  f64        function  f32  f64        function  f32  f64
    exp       1    0.96       sin       1    0.75       erf       1    0.92
    exp2      1    0.87       cos       1    0.75       atan      2    2.10
    expm1     1    1.82       tan       0    2.03       atan2     2    2.23
    log       1    0.78       tanh      2    2.46       pow       0    1.13
    log2      1    0.71       sigmoid   2    2.29
    log1p     1    0.82

f32 sin and cos evaluate their polynomials in float32 (after a double reduction): within
1 ulp for every float32 input, and correctly rounded for 99% of them (1.4% of standard
normal inputs are 1 ulp off). f32 tan divides in double and is correctly rounded for
every float32 input. The f64 figures hold over the whole range, huge trig arguments included (Payne-Hanek path,
also checked on the double closest to a multiple of pi/2, 6381956970095103 * 2^797).
The tests assert <= 4 ulp for every function and both formats.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ....core.errors import BackendError
from .core import FORMATS, Emit
from .exp import emit_exp, emit_exp2, emit_expm1, emit_sigmoid, emit_tanh
from .log import emit_log, emit_log1p, emit_log2
from .special import emit_atan, emit_atan2, emit_erf, emit_pow
from .trig import emit_cos, emit_sin, emit_tan

_EMITTERS: dict[str, Callable[..., ir.Value]] = {
    "exp": emit_exp, "exp2": emit_exp2, "expm1": emit_expm1,
    "log": emit_log, "log2": emit_log2, "log1p": emit_log1p,
    "sin": emit_sin, "cos": emit_cos, "tan": emit_tan,
    "tanh": emit_tanh, "sigmoid": emit_sigmoid, "erf": emit_erf,
    "atan": emit_atan, "atan2": emit_atan2, "pow": emit_pow,
}

MATH_FUNCTIONS: tuple[str, ...] = tuple(_EMITTERS)
"""Names accepted by get_math_function."""

ARITY: dict[str, int] = {name: 2 if name in ("atan2", "pow") else 1 for name in MATH_FUNCTIONS}
"""Number of float arguments: atan2(y, x) and pow(x, y) take two, the rest one."""

ACCURACY: dict[str, tuple[float, float]] = {
    "exp": (1, 0.96), "exp2": (1, 0.87), "expm1": (1, 1.82), "log": (1, 0.78), "log2": (1, 0.71),
    "log1p": (1, 0.82), "sin": (1, 0.75), "cos": (1, 0.75), "tan": (0, 2.03), "tanh": (2, 2.46),
    "sigmoid": (2, 2.29), "erf": (1, 0.92), "atan": (2, 2.10), "atan2": (2, 2.23), "pow": (0, 1.13),
}
"""Max error in ulps (f32, f64) as measured by tests/lower/test_llvm_math.py (see the docstring)."""


def math_calls(root) -> int:
    """The math-function applications in loop IR `root` (Unary or Binary nodes naming one):
    each is a polynomial of a few dozen instructions and constants, inlined where it is used."""
    from ...loops.ir import Binary, Unary
    from ...loops.walk import walk
    return sum(1 for node in walk(root) if isinstance(node, (Unary, Binary)) and node.fn in _EMITTERS)


def math_function_name(name: str, dtype: str) -> str:
    return f"tc.{name}.{dtype}"


def get_math_function(module: ir.Module, name: str, dtype: str) -> ir.Function:
    """The function `tc.<name>.<dtype>` in module, defined there on first use.

    name is one of MATH_FUNCTIONS, dtype "f32" or "f64". The function takes and returns
    floats of that type (two arguments for atan2(y, x) and pow(x, y))."""
    if name not in _EMITTERS:
        raise BackendError(f"no LLVM math function {name!r}; known: {', '.join(MATH_FUNCTIONS)}")
    if dtype not in FORMATS:
        raise BackendError(f"math function {name!r}: dtype must be 'f32' or 'f64', got {dtype!r}")
    fname = math_function_name(name, dtype)
    existing = module.globals.get(fname)
    if existing is not None:
        return existing
    fmt = FORMATS[dtype]
    fn = ir.Function(module, ir.FunctionType(fmt.ftype, [fmt.ftype] * ARITY[name]), fname)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(_EMITTERS[name](Emit(builder, fmt), *fn.args))
    return fn
