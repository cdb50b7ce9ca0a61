"""Running a composite op's decomposition (its `composite:` program in ops.yaml).

Calls in the program go to the public API (`tracecomp.<name>`), methods to Tensor, so
the decomposition is dispatched like user code: eagerly it computes, under the Tracer
it records primitive ops.  The helpers below are the only non-op functions programs may
call; each is a small pure function on Python values (shapes, dims).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

from . import dtypes as dt
from .errors import ArgumentError, DTypeError, ShapeError, TracecompError
from .ops import formula
from .ops.table import OpDef


def _trailing_dims(x, normalized_shape) -> list[int]:
    n = len(normalized_shape)
    if tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape) or n > x.ndim:
        raise ShapeError(f"layer_norm: normalized_shape {tuple(normalized_shape)} does not match the "
                         f"trailing dims of the input shape {x.shape}")
    return list(range(x.ndim - n, x.ndim))


def _reduce_loss(x, reduction: str):
    if reduction == "mean":
        return x.mean()
    if reduction == "sum":
        return x.sum()
    if reduction == "none":
        return x
    raise ArgumentError(f"argument 'reduction' must be 'mean', 'sum' or 'none', got {reduction!r}")


def _flatten_shape(shape, start: int, end: int) -> list[int]:
    n = max(len(shape), 1)
    s, e = start % n if -n <= start < n else None, end % n if -n <= end < n else None
    if s is None or e is None or s > e:
        raise ShapeError(f"flatten: start_dim {start} and end_dim {end} are invalid for shape {tuple(shape)}")
    if not shape:
        return [1]
    return list(shape[:s]) + [math.prod(shape[s:e + 1])] + list(shape[e + 1:])


def _swapped_dims(ndim: int, d0: int, d1: int) -> list[int]:
    n = max(ndim, 1)
    for d in (d0, d1):
        if not -n <= d < n:
            raise ShapeError(f"transpose: dim {d} is out of range for a tensor with {ndim} dims")
    dims = list(range(ndim))
    if ndim:
        dims[d0 % n], dims[d1 % n] = dims[d1 % n], dims[d0 % n]
    return dims


def _chunk_size(x, chunks: int, dim: int) -> int:
    if chunks <= 0:
        raise ShapeError(f"chunk: 'chunks' must be positive, got {chunks}")
    return max(1, -(-x.shape[dim] // chunks))


def _halvable(name: str, x, dim: int) -> bool:
    """True when dim `dim` of `x` splits into two equal halves; else a ShapeError."""
    if x.ndim == 0 or not -x.ndim <= dim < x.ndim:
        raise ShapeError(f"{name}: dim {dim} is out of range for a tensor of shape {x.shape}")
    if x.shape[dim] % 2:
        raise ShapeError(f"{name}: halving dim {dim} needs an even size, got shape {x.shape}")
    return True


def _expect_ranks(name: str, a, b, n: int):
    raise ShapeError(f"{name}: expects two {n}-D tensors, got shapes {a.shape} and {b.shape}")


def _expect_float(name: str, x):
    raise DTypeError(f"{name}: expects a floating-point tensor, got {x.dtype.label}")


HELPERS = {
    "trailing_dims": _trailing_dims, "reduce_loss": _reduce_loss, "flatten_shape": _flatten_shape,
    "swapped_dims": _swapped_dims, "chunk_size": _chunk_size, "expect_ranks": _expect_ranks,
    "halvable": _halvable,
    "expect_float": _expect_float,
    "range": range, "len": len, "list": list, "reversed": reversed, "float": float,
    "float32": dt.FLOAT32, "float64": dt.FLOAT64, "int32": dt.INT32, "int64": dt.INT64, "bool": dt.BOOL,
}


def _call(name: str, args: list, kwargs: dict):
    if name in HELPERS:
        return HELPERS[name](*args, **kwargs)
    import tracecomp
    fn = getattr(tracecomp, name, None)
    if fn is None:
        raise ArgumentError(f"composite program calls unknown function '{name}'")
    return fn(*args, **kwargs)


def _describe_args(args: dict[str, Any]) -> str:
    """Arguments as the user gave them, tensors by shape: `'input' (2, 3), 'dim' 1`."""
    parts = []
    for k, v in args.items():
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            v = tuple(v.shape)
        elif isinstance(v, (list, tuple)) and v and all(hasattr(t, "shape") for t in v):
            v = f"[{', '.join(str(tuple(t.shape)) for t in v)}]"
        if v is not None:
            parts.append(f"'{k}' {v!s}" if not isinstance(v, str) or v.startswith("[") else f"'{k}' {v!r}")
    return ", ".join(parts)


def run_composite(op: OpDef, args: dict[str, Any]):
    env = {**{k: v for k, v in HELPERS.items() if not callable(v) or isinstance(v, dt.DType)}, **args}
    try:
        with _derived_from(op):
            return formula.Evaluator(env, _call).run_program(op.program)
    except TracecompError as e:
        # The failing op is inside the decomposition; say which op the user called, with what.
        e.args = (f"{op.name}() failed for {_describe_args(args)}: {e.args[0]}",) + e.args[1:]
        raise


def _derived_from(op: OpDef):
    """While a trace records a composite's program, its ops name the composite as their
    source (the outermost one, when composites nest)."""
    from .tracer import current
    ctx = current()
    loc = ctx.location() if ctx is not None else None
    return contextlib.nullcontext() if loc is None else ctx.located(loc.derived(source=op.ir_name))
