"""Checking a state dict before `Module.load_state_dict` copies it, in PyTorch's words.

PyTorch's own report is the model: one RuntimeError, "Error(s) in loading state_dict for
<Module>:", then one tab-indented line per problem: the missing keys, the unexpected keys,
then each key whose value does not fit.  Invariants:
- nothing is copied unless every check passes (the caller copies after `check_loadable`);
- with strict=False, missing and unexpected keys are returned, not raised, but a value of
  the wrong shape or dtype still raises (as in PyTorch);
- tracecomp does not cast a checkpoint: a dtype that differs is reported like a shape
  (PyTorch would cast it silently);
- shapes print as tracecomp prints them (tuples), where PyTorch prints torch.Size([...]).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from ..core import dtypes as dt
from ..tensors.checkpoint import CheckpointError, StateKeys
from ..tensors.tensor import Tensor, as_tensor


class StateDictError(CheckpointError, RuntimeError):
    """A state dict that does not fit the module (a RuntimeError, as PyTorch raises, and a
    CheckpointError, as tracecomp's checkpoint errors are)."""


def check_loadable(module_name: str, own: Mapping[str, Tensor], state_dict: Any, strict: bool,
                   where: Optional[str] = None) -> tuple[dict[str, Tensor], StateKeys]:
    """(the values of `state_dict` as tensors, by key; the missing and unexpected keys),
    checked against the module's own tensors `own`.  Raises one StateDictError listing every
    problem; TypeError if `state_dict` is not a mapping."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    problems = []
    if strict and missing:
        problems.append(f"Missing key(s) in state_dict: {_listed(missing)}. ")
    if strict and unexpected:
        problems.append(f"Unexpected key(s) in state_dict: {_listed(unexpected)}. ")
    values = {}
    for key, mine in own.items():
        if key in state_dict:
            value, problem = _value(key, state_dict[key], mine)
            if problem:
                problems.append(problem)
            else:
                values[key] = value
    if problems:
        source = f" from {where}" if where else ""
        raise StateDictError(f"Error(s) in loading state_dict for {module_name}{source}:\n\t"
                             + "\n\t".join(problems))
    return values, StateKeys(missing, unexpected)


def _value(key: str, given: Any, mine: Tensor) -> tuple[Optional[Tensor], Optional[str]]:
    """(`given` as a tensor, None) if it fits `mine`; else (None, the line that says why)."""
    if not (isinstance(given, (Tensor, np.ndarray, np.generic, int, float, bool)) or hasattr(given, "__array__")):
        return None, (f'While copying the parameter named "{key}", expected tc.Tensor or an array '
                      f"from checkpoint but received {type(given)}")
    try:
        value = as_tensor(given)
    except (TypeError, ValueError) as e:          # an array of strings or objects
        return None, f'While copying the parameter named "{key}", the value is not a tensor: {e}'
    if tuple(value.shape) != tuple(mine.shape):
        return None, (f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} "
                      f"from checkpoint, the shape in current model is {tuple(mine.shape)}.")
    if value.dtype != mine.dtype:
        return None, (f"dtype mismatch for {key}: copying a param with dtype {dt.to_dtype(value.dtype).label} "
                      f"from checkpoint, the dtype in current model is {dt.to_dtype(mine.dtype).label} "
                      "(tracecomp does not cast a checkpoint: convert it first)")
    return value, None


def _listed(keys: list[str]) -> str:
    return ", ".join(f'"{k}"' for k in keys)
