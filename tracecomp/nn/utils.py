"""Gradient clipping (torch.nn.utils's clip_grad_norm_ / clip_grad_value_ / get_total_norm),
and a pure clip_grad_norm on a pytree of gradients for traced train steps."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..tensors import pytree
from ..autograd.grad_mode import no_grad
from ..core.errors import ArgumentError, TracecompError
from ..tensors.tensor import Tensor, as_tensor
from ..dispatch import api as tc

# Added to the norm before dividing, as PyTorch does, so that a zero norm divides safely.
_EPS = 1e-6


class NonFiniteNormError(TracecompError, RuntimeError):
    """clip_grad_norm_(..., error_if_nonfinite=True) found a NaN or infinite total norm."""


def _parameter_list(parameters: Any) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        return [parameters]
    if not isinstance(parameters, Iterable):
        raise ArgumentError(f"expected a tensor or an iterable of tensors, got a {type(parameters).__name__}")
    params = list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise ArgumentError(f"parameters[{i}] is a {type(p).__name__}, not a tc.Tensor")
    return params


def get_total_norm(tensors: Any, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """The norm of all `tensors` together, as if concatenated into one vector (the norm of
    their norms, as PyTorch computes it).  Works on traced tensors too (error_if_nonfinite
    needs values, so it is for eager use)."""
    tensors = [as_tensor(t) for t in ([tensors] if isinstance(tensors, Tensor) else tensors)]
    if not tensors:
        return as_tensor(np.float32(0.0))
    norm_type = float(norm_type)
    total = tc.linalg_vector_norm(tc.stack([tc.linalg_vector_norm(t, norm_type) for t in tensors]), norm_type)
    if error_if_nonfinite and not bool(total.isfinite().item()):
        raise NonFiniteNormError(f"the total norm of order {norm_type} of the gradients is {total.item()}, so "
                                 "they cannot be clipped; pass error_if_nonfinite=False to clip anyway")
    return total


def _clip_coefficient(total: Tensor, max_norm: float) -> Tensor:
    # Clamping (instead of `if coef < 1`) keeps the step free of data-dependent branches.
    return tc.clamp(float(max_norm) / (total + _EPS), max=1.0)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale the `.grad` of `parameters` in place so that their total norm is at most
    `max_norm`; returns the total norm before clipping (torch.nn.utils.clip_grad_norm_)."""
    grads = [p.grad for p in _parameter_list(parameters) if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if grads:
        scale = _clip_coefficient(total, max_norm)
        with no_grad():
            for g in grads:
                g.mul_(scale.to(g.dtype))
    return total


def clip_grad_value_(parameters: Any, clip_value: float) -> None:
    """Clamp every `.grad` of `parameters` into [-clip_value, clip_value], in place."""
    clip_value = float(clip_value)
    with no_grad():
        for p in _parameter_list(parameters):
            if p.grad is not None:
                p.grad.clamp_(min=-clip_value, max=clip_value)


def clip_grad_norm(grads: Any, max_norm: float, norm_type: float = 2.0) -> Any:
    """The pytree `grads` scaled so that its total norm is at most `max_norm`: pure, for a
    traced train step (between tc.value_and_grad and the optimizer's update)."""
    leaves, structure = pytree.flatten(grads, lambda x: isinstance(x, (Tensor, np.ndarray, np.generic)))
    if not leaves:
        raise ArgumentError(f"clip_grad_norm: grads holds no tensors (got {type(grads).__name__})")
    leaves = [as_tensor(g) for g in leaves]
    scale = _clip_coefficient(get_total_norm(leaves, norm_type), max_norm)
    return pytree.unflatten(structure, [g * scale.to(g.dtype) for g in leaves])


__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "get_total_norm", "NonFiniteNormError"]
