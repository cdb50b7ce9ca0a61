"""SGD with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD's rule)."""
from __future__ import annotations

from typing import Any

from .optimizer import Optimizer, non_negative, coef
from ..dispatch import api as tc


class SGD(Optimizer):
    def __init__(self, params: Any = None, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False, master_weights: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov, maximize=maximize),
                         master_weights)

    def _check(self, hyper: dict, where: str) -> None:
        for key in ("lr", "momentum", "weight_decay"):
            non_negative(hyper, key, where)
        if hyper["nesterov"] and (hyper["momentum"] <= 0 or hyper["dampening"] != 0):
            from ..core.errors import ArgumentError
            raise ArgumentError(f"{where}: nesterov momentum requires a momentum > 0 and zero dampening "
                                f"(got momentum={hyper['momentum']!r}, dampening={hyper['dampening']!r})")

    def _buffer_names(self, group: dict) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _rule(self, param, grad, buffers, step, lr, group):
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * param
        momentum, dampening = group["momentum"], group["dampening"]
        if momentum != 0:
            buf = buffers["momentum_buffer"] * momentum + (g if dampening == 0 else (1 - dampening) * g)
            if dampening != 0:
                # PyTorch's first step starts the buffer at the gradient itself, undampened.
                buf = tc.where(step == 1, g, buf)
            buffers = {"momentum_buffer": buf}
            g = g + momentum * buf if group["nesterov"] else buf
        return param - coef(lr, param) * g, buffers
