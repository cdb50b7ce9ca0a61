"""Adagrad with lr decay (torch.optim.Adagrad's rule)."""
from __future__ import annotations

from typing import Any

from .optimizer import Optimizer, non_negative, coef
from ..dispatch import api as tc


class Adagrad(Optimizer):
    def __init__(self, params: Any = None, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, *, maximize: bool = False,
                 master_weights: bool = False) -> None:
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps,
                                      maximize=maximize), master_weights)

    def _check(self, hyper: dict, where: str) -> None:
        for key in ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            non_negative(hyper, key, where)

    def _buffer_names(self, group: dict) -> tuple[str, ...]:
        return ("sum",)

    def _init_buffer(self, name, param, group):
        return tc.full_like(param, group["initial_accumulator_value"])

    def _rule(self, param, grad, buffers, step, lr, group):
        g = -grad if group["maximize"] else grad
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * param
        decayed_lr = lr / (1 + (step.double() - 1) * group["lr_decay"])
        total = buffers["sum"] + g * g
        std = total.sqrt() + group["eps"]
        return param - coef(decayed_lr, param) * (g / std), {"sum": total}
