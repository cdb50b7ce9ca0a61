"""tc.nn.init: PyTorch's initializers (in place, without recording gradients), drawn from
the generator that tc.manual_seed seeds.  The distributions and their bounds are
PyTorch's; the numbers are not (NumPy's generator, not PyTorch's)."""
from __future__ import annotations

import math

import numpy as np

from ..core import random as _random
from ..core.errors import ArgumentError

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table)."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ArgumentError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def calculate_fan_in_and_fan_out(t) -> tuple[int, int]:
    if t.ndim < 2:
        raise ArgumentError(f"fan in and fan out need a tensor of at least 2 dims, got shape {tuple(t.shape)}")
    receptive = math.prod(t.shape[2:])
    return t.shape[1] * receptive, t.shape[0] * receptive


def _fan(t, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    return fan_in if mode == "fan_in" else fan_out


def _fill(t, values: np.ndarray):
    from ..autograd.grad_mode import no_grad
    with no_grad():
        t.copy_(values.astype(t.dtype.np))
    return t


def _gen() -> np.random.Generator:
    return _random.generator()


def uniform_(t, a: float = 0.0, b: float = 1.0):
    return _fill(t, _gen().uniform(a, b, size=t.shape))


def normal_(t, mean: float = 0.0, std: float = 1.0):
    return _fill(t, _gen().normal(mean, std, size=t.shape))


def trunc_normal_(t, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0):
    """Normal values redrawn until they fall in [a, b]."""
    out = _gen().normal(mean, std, size=t.shape)
    bad = (out < a) | (out > b)
    while bad.any():
        out[bad] = _gen().normal(mean, std, size=int(bad.sum()))
        bad = (out < a) | (out > b)
    return _fill(t, out)


def constant_(t, val: float):
    return _fill(t, np.full(t.shape, val))


def ones_(t):
    return constant_(t, 1.0)


def zeros_(t):
    return constant_(t, 0.0)


def xavier_uniform_(t, gain: float = 1.0):
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)


def xavier_normal_(t, gain: float = 1.0):
    fan_in, fan_out = calculate_fan_in_and_fan_out(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform_(t, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / _fan(t, mode))
    return uniform_(t, -bound, bound)


def kaiming_normal_(t, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    return normal_(t, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(t, mode)))
