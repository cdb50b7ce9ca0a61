"""Packaging an op's result tensors the way its schema returns them."""
from __future__ import annotations

import collections
import functools

from ..ops.table import OpDef
from .tensor import Tensor


@functools.cache
def _named_tuple(name: str, fields: tuple[str, ...]):
    return collections.namedtuple(name, fields)


def package(op: OpDef, tensors: list):
    """One Tensor; a tuple for Tensor[] returns (or for more results than one Tensor return: a
    composite such as adaptive_max_pool2d(..., return_indices=True)); a named tuple
    (values, indices) for named returns."""
    returns = op.schema.returns
    if len(returns) == 1 and (returns[0].type.is_list or len(tensors) > 1):
        return tuple(tensors)
    if len(returns) == 1:
        return tensors[0]
    names = tuple(r.name or f"out{i}" for i, r in enumerate(returns))
    return _named_tuple(op.name, names)(*tensors)


def outputs(result) -> list:
    """An op's result as a list of its tensors (the inverse of `package`)."""
    return list(result) if isinstance(result, (tuple, list)) else [result]


def map_tensors(args: dict, fn) -> dict:
    """An op's arguments with every Tensor (also inside a Tensor[]) replaced by fn(tensor)."""
    out = {}
    for k, v in args.items():
        if isinstance(v, Tensor):
            v = fn(v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], Tensor):
            v = [fn(t) for t in v]
        out[k] = v
    return out


def type_args(args: dict) -> dict:
    """The arguments with each Tensor replaced by its TensorType (for the shape rules)."""
    return map_tensors(args, lambda t: t._type)
