"""Evaluating derivatives.yaml formulas through the dispatcher: one evaluator, every mode.

Formulas see the op's arguments, its outputs and the incoming gradients as Tensors;
calls go to the helpers and to the public API, so on eager tensors they compute, on
traced tensors they record backward ops, and with grad mode on they build history for
higher derivatives.
"""
from __future__ import annotations

from typing import Any

from ..core.errors import ArgumentError
from ..ops import formula
from . import helpers
from ..dispatch import api as tc


def call_function(name: str, args: list, kwargs: dict):
    fn = helpers.HELPERS.get(name)
    if fn is None:
        fn = getattr(tc, name, None)
        if fn is None:
            raise ArgumentError(f"derivative formula calls unknown function '{name}'")
    return fn(*args, **kwargs)


def output_env(op, outputs: list) -> dict[str, Any]:
    """`result`, `result0..N` and the named outputs (`values`, `indices`)."""
    env: dict[str, Any] = {"result": outputs[0] if len(outputs) == 1 else tuple(outputs)}
    for i, (r, out) in enumerate(zip(op.schema.returns, outputs)):
        env[f"result{i}"] = out
        if r.name:
            env[r.name] = out
    if op.schema.returns[0].type.is_list:
        env["result"] = list(outputs)
    return env


def evaluate(expr, env: dict[str, Any]) -> Any:
    return formula.Evaluator(env, call_function).eval(expr)
