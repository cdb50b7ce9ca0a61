"""Evaluating an elementwise op's table formula with a backend's scalar primitives.

The same formula serves every backend: NumPy kernels pass NumPy ufuncs, the lowering
passes loop-IR expression builders.  Calls of other elementwise ops (`sigmoid(self)`
inside silu) expand inline, with the callee's arguments bound by position or keyword.
"""
from __future__ import annotations

from typing import Any, Callable

from . import formula
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


def evaluate(op: OpDef, env: dict[str, Any], primitives: dict[str, Callable]) -> Any:
    """The value of `op`'s formula with its arguments in `env`."""
    table = default_table()

    def call(name, values, kwargs):
        if name in primitives:
            return primitives[name](*values, **kwargs)
        callee = table[name]
        return evaluate(callee, bind_call(callee, values, kwargs), primitives)
    return formula.Evaluator(env, call).eval(op.expr)
