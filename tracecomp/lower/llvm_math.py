"""Vectorizable scalar math functions in LLVM IR, for float32 and float64.

`get_math_function(module, name, dtype)` defines `tc.<name>.<dtype>` (e.g. `tc.exp.f32`)
in an llvmlite module on first use and returns it; the code generator calls it from loop
bodies. Each function is straight-line code (selects, no branches, no libm calls, no
memory access: tables are a handful of constants picked by selects), has internal
linkage and is `alwaysinline`, so after inlining LLVM's loop vectorizer widens it like
any arithmetic. The algorithms (range reduction, minimax polynomials from
`llvm_math_fit.py`, special cases) are described in the llvm_math_*.py modules:
exp (exp, exp2, expm1, tanh, sigmoid), log (log, log2, log1p), trig (sin, cos, tan),
special (erf, atan, atan2, pow). Special values follow C99 Annex F: NaN propagates,
+-inf and +-0 as in C (sin(-0) = -0, expm1(-0) = -0, pow(x, 0) = 1, ...), subnormal
inputs and results are computed, not flushed.

Measured accuracy (max error in ulps; tests/test_llvm_math.py; f32 against float64
numpy/math rounded to float32, over every 2^8-th float32 bit pattern (16.8 M points) plus
special and boundary values (pow, atan2: 4 M random pairs plus all special pairs);
f64 against long-double libm, or a long-double series for erf, over 2 M points
log-uniform across the whole range and dense samples of the interesting intervals):

    function   f32   f64          function   f32   f64
    (see the table filled in by the measurement run at the end of this docstring)

The numbers: see ACCURACY below (kept next to the code that produced them).
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ..errors import BackendError
from .llvm_math_core import FORMATS, Emit
from .llvm_math_exp import emit_exp, emit_exp2, emit_expm1, emit_sigmoid, emit_tanh
from .llvm_math_log import emit_log, emit_log1p, emit_log2
from .llvm_math_special import emit_atan, emit_atan2, emit_erf, emit_pow
from .llvm_math_trig import emit_cos, emit_sin, emit_tan

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

# Max error in ulps measured by tests/test_llvm_math.py (see module docstring for sweeps).
ACCURACY: dict[str, tuple[float, float]] = {}


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
