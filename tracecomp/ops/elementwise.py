"""Evaluating an elementwise op's table formula with a backend's scalar primitives.

The same formula serves every backend: NumPy kernels pass NumPy ufuncs, the lowering
passes loop-IR expression builders.  Calls of other elementwise ops (`sigmoid(self)`
inside silu) expand inline, with the callee's arguments bound by position or keyword.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..core.dtypes import DType, finite_max as finite_max_of
from . import formula
from .special import SPECIAL
from .table import OpDef, default_table


def bind_call(op: OpDef, values: list, kwargs: dict) -> dict[str, Any]:
    """Arguments of a nested elementwise call by name, defaults filled in."""
    env = {}
    for i, a in enumerate(op.schema.arguments):
        if i < len(values):
            env[a.name] = values[i]
        elif a.name in kwargs:
            env[a.name] = kwargs[a.name]
        else:
            env[a.name] = a.default_value()
    return env


CONSTANTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi}


def _numpy_dtype(x: Any) -> np.dtype:
    """The NumPy dtype of a backend's value: an array, or an expression builder whose
    dtype is a tracecomp DType; a Python scalar's as NumPy takes it."""
    d = getattr(x, "dtype", None)
    if d is None:
        return np.asarray(x).dtype
    return d if isinstance(d, np.dtype) else np.dtype(d.np)


def is_floating(x: Any) -> bool:
    return _numpy_dtype(x).kind == "f"


def finite_max(x: Any) -> float:
    """The largest finite value of a float value's dtype (nan_to_num's default for inf)."""
    return float(np.finfo(_numpy_dtype(x)).max)


# Static questions about a value's dtype, answered while the formula is evaluated: they
# choose between formulas and give constants; no backend sees them.
BUILTINS: dict[str, Callable] = {"is_floating": is_floating, "finite_max": finite_max}


def evaluate(op: OpDef, env: dict[str, Any], primitives: dict[str, Callable], result: DType | None = None) -> Any:
    """The value of `op`'s formula with its arguments in `env`.  `result`, the op's result
    dtype, answers `finite_max` where the values are computed wider than the result (a
    bfloat16 op's formula runs on float32 values, yet nan_to_num gives bfloat16's maximum)."""
    table = default_table()

    def call(name, values, kwargs):
        if name in SPECIAL:
            return SPECIAL[name](primitives, *values, **kwargs)
        if name in primitives:
            return primitives[name](*values, **kwargs)
        if name == "finite_max" and result is not None and result.is_half:
            return finite_max_of(result)
        if name in BUILTINS:
            return BUILTINS[name](*values, **kwargs)
        callee = table[name]
        return evaluate(callee, bind_call(callee, values, kwargs), primitives, result)
    return formula.Evaluator({**CONSTANTS, **env}, call).eval(op.expr)
