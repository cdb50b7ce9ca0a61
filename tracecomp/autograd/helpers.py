"""Named helper functions that derivative formulas may call, besides the ops of ops.yaml.

Each is written once, in terms of tensor ops (so it works eagerly, traced, and under
autograd for higher derivatives).  Formulas stay one line; the logic lives here.
"""
from __future__ import annotations

from typing import Any, Callable


def sum_to(grad, shape: tuple[int, ...]):
    """Undo broadcasting: sum `grad` over the dims that broadcasting added or expanded to `shape`."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1]
    out = grad.sum(dims, keepdim=True) if dims else grad
    return out.reshape(shape) if tuple(out.shape) != shape else out


def reduced_dims(shape: tuple[int, ...], dim) -> list[int]:
    """The dims a reduction with `dim` (None, int or list; negatives allowed) removed."""
    n = len(shape)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(n))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted(d % n for d in dims) if n else []


def unsqueeze_reduced(grad, shape: tuple[int, ...], dim, keepdim: bool):
    """Give a reduction's gradient back the reduced dims (size 1) that keepdim=False removed."""
    if keepdim:
        return grad
    for d in reduced_dims(shape, dim):
        grad = grad.unsqueeze(d)
    return grad


def sum_backward(grad, shape: tuple[int, ...], dim, keepdim: bool):
    return unsqueeze_reduced(grad, shape, dim, keepdim).expand(tuple(shape))


HELPERS: dict[str, Callable[..., Any]] = {
    "sum_to": sum_to,
    "reduced_dims": reduced_dims,
    "unsqueeze_reduced": unsqueeze_reduced,
    "sum_backward": sum_backward,
}
