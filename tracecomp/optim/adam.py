"""Adam and AdamW (torch.optim.Adam / AdamW's rules, with amsgrad and maximize).

AdamW differs only in its weight decay: the parameter shrinks by (1 - lr * weight_decay)
before the Adam step, instead of weight_decay * param joining the gradient."""
from __future__ import annotations

from typing import Any

from .optimizer import Optimizer, check_betas, non_negative, coef, lerp
from ..dispatch import api as tc


class Adam(Optimizer):
    _decoupled_weight_decay = False

    def __init__(self, params: Any = None, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 maximize: bool = False, master_weights: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas,
                                      eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize),
                         master_weights)

    def _check(self, hyper: dict, where: str) -> None:
        for key in ("lr", "eps", "weight_decay"):
            non_negative(hyper, key, where)
        check_betas(hyper, where)

    def _buffer_names(self, group: dict) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _rule(self, param, grad, buffers, step, lr, group):
        beta1, beta2 = group["betas"]
        weight_decay = group["weight_decay"]
        g = -grad if group["maximize"] else grad
        if weight_decay != 0:
            if self._decoupled_weight_decay:
                param = param * coef(1 - lr * weight_decay, param)
            else:
                g = g + weight_decay * param
        exp_avg = lerp(buffers["exp_avg"], g, 1 - beta1)
        exp_avg_sq = buffers["exp_avg_sq"] * beta2 + (1 - beta2) * g * g
        new_buffers = {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        # The bias corrections in float64, as PyTorch computes them in Python floats.
        t = step.double()
        step_size = lr / (1 - beta1 ** t)
        bias_correction2_sqrt = (1 - beta2 ** t).sqrt()
        second_moment = exp_avg_sq
        if group["amsgrad"]:
            second_moment = new_buffers["max_exp_avg_sq"] = tc.maximum(buffers["max_exp_avg_sq"], exp_avg_sq)
        denom = second_moment.sqrt() / coef(bias_correction2_sqrt, param) + group["eps"]
        return param - coef(step_size, param) * (exp_avg / denom), new_buffers


class AdamW(Adam):
    _decoupled_weight_decay = True

    def __init__(self, params: Any = None, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, master_weights: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize, master_weights=master_weights)
