"""Composites marked `opmath: true` in ops.yaml run in float32 for half-precision inputs.

PyTorch computes softmax, the norms, the losses and resampling for bfloat16/float16
tensors in float32 inside one kernel and rounds the result once; a composite program run
op by op in the half dtype would round after every step (and sum squares of bfloat16
values in bfloat16).  So, when the op's first tensor argument is half: its half tensor
arguments enter the program as float32 copies (exact), and the program's float32 results
leave it rounded to that dtype.  Arguments the op writes (batch_norm's running stats) stay
as they are, so the writes reach them; an explicit `dtype=` keeps the program as written.
"""
from __future__ import annotations

from typing import Any, Callable

from ..core import dtypes as dt
from ..ops.table import OpDef
from ..tensors.tensor import Tensor


def run_in_float32(op: OpDef, args: dict[str, Any], run: Callable[[dict[str, Any]], Any]) -> Any:
    """`run(args)`, in float32 where the op asks for it (see the module docstring)."""
    half = _half_dtype(op, args)
    if half is None:
        return run(args)
    written = {a.name for a in op.schema.arguments if a.type.annotation and a.type.annotation.is_write}
    wide = {k: v if k in written else _map(v, lambda t: t.to(dt.FLOAT32) if t.dtype.is_half else t)
            for k, v in args.items()}
    return _map(run(wide), lambda t: t.to(half) if t.dtype is dt.FLOAT32 else t)


def _half_dtype(op: OpDef, args: dict[str, Any]) -> dt.DType | None:
    if not op.opmath or args.get("dtype") is not None:
        return None
    first = next((args[a.name] for a in op.schema.tensor_arguments if isinstance(args.get(a.name), Tensor)), None)
    return first.dtype if first is not None and first.dtype.is_half else None


def _map(v: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """`fn` on a Tensor, or on each Tensor of a list or tuple (other values as they are)."""
    if isinstance(v, Tensor):
        return fn(v)
    if isinstance(v, (list, tuple)):
        items = [_map(x, fn) for x in v]
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)     # a named tuple
    return v
