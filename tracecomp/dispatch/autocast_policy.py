"""What tc.autocast does to one op call: cast its floating tensor arguments by the op's
`autocast` policy in ops.yaml (PyTorch's CPU autocast lists).

  lower:   float32/bfloat16/float16 tensors to the autocast dtype (matmuls, convs, attention)
  fp32:    float32/bfloat16/float16 tensors to float32 (losses, prod, cdist)
  promote: every floating tensor to the widest floating dtype among them (cat, stack)

float64 tensors stay as they are under lower and fp32, as in PyTorch (autocast narrows only
what is already single precision or below); integer and bool tensors are never cast, and
arguments the op writes in place keep their tensor, so the write reaches it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ..core import dtypes as dt
from ..ops.table import OpDef
from ..tensors.tensor import Tensor

Cast = Callable[[Tensor, dt.DType], Tensor]


def cast_arguments(op: OpDef, args: dict[str, Any], low: dt.DType, cast: Cast) -> dict[str, Any]:
    """`args` with the tensors `op`'s policy casts replaced by `cast(tensor, dtype)`."""
    written = {a.name for a in op.schema.arguments if a.type.annotation and a.type.annotation.is_write}
    target = _target(op.autocast, low, [t for k, v in args.items() if k not in written for t in _tensors(v)])
    if target is None:
        return args

    def convert(t):
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point or t.dtype is target:
            return t
        if op.autocast != "promote" and t.dtype is dt.FLOAT64:
            return t
        return cast(t, target)

    return {k: v if k in written else _map(v, convert) for k, v in args.items()}


def _target(policy: str, low: dt.DType, tensors: list[Tensor]) -> dt.DType | None:
    if policy == "lower":
        return low
    if policy == "fp32":
        return dt.FLOAT32
    floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
    return functools.reduce(dt.promote_types, floats) if floats else None


def _tensors(v: Any) -> list[Tensor]:
    items = v if isinstance(v, (list, tuple)) else (v,)
    return [t for t in items if isinstance(t, Tensor)]


def _map(v: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(v, (list, tuple)):
        return type(v)(fn(x) for x in v)
    return fn(v)
