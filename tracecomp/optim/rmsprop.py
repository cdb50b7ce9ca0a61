"""RMSprop, plain, centered and with momentum (torch.optim.RMSprop's rule)."""
from __future__ import annotations

from typing import Any

from .optimizer import Optimizer, non_negative, coef, lerp


class RMSprop(Optimizer):
    def __init__(self, params: Any = None, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, *,
                 maximize: bool = False, master_weights: bool = False) -> None:
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize), master_weights)

    def _check(self, hyper: dict, where: str) -> None:
        for key in ("lr", "alpha", "eps", "weight_decay", "momentum"):
            non_negative(hyper, key, where)

    def _buffer_names(self, group: dict) -> tuple[str, ...]:
        return (("square_avg",) + (("momentum_buffer",) if group["momentum"] > 0 else ())
                + (("grad_avg",) if group["centered"] else ()))

    def _rule(self, param, grad, buffers, step, lr, group):
        alpha = group["alpha"]
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * param
        square_avg = buffers["square_avg"] * alpha + (1 - alpha) * g * g
        new_buffers = {"square_avg": square_avg}
        if group["centered"]:
            grad_avg = new_buffers["grad_avg"] = lerp(buffers["grad_avg"], g, 1 - alpha)
            avg = (square_avg - grad_avg * grad_avg).sqrt()
        else:
            avg = square_avg.sqrt()
        avg = avg + group["eps"]
        if group["momentum"] > 0:
            buf = new_buffers["momentum_buffer"] = buffers["momentum_buffer"] * group["momentum"] + g / avg
            return param - coef(lr, param) * buf, new_buffers
        return param - coef(lr, param) * (g / avg), new_buffers
