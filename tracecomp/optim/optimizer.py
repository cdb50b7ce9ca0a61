"""The Optimizer base class: PyTorch's eager interface (param groups, zero_grad, step,
state_dict) and the pure interface for a traced train step (init, update), both driving
one update rule per optimizer (`_rule`), so that they compute the same numbers.

A subclass declares its hyper-parameters (`defaults`), checks them (`_check`), names the
per-parameter buffers a group needs (`_buffer_names`) and implements `_rule`: one
parameter's new value and buffers from its gradient, the step count and the lr, with
tensor ops only (no Python branch on a tensor's value), so that the rule traces.

`master_weights=True` (mixed-precision training): each bfloat16/float16 parameter gets a
float32 copy in its state ("master_param"), its buffers are float32, and the rule runs on
that copy with the gradient widened to float32; the parameter receives the new copy
rounded to its dtype.  Small updates then accumulate in the copy instead of vanishing in
the parameter's 8 bits of mantissa.  Eager step, init/update and state_dict all carry it.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..tensors import pytree
from ..autograd.grad_mode import enable_grad, no_grad
from ..core.dtypes import FLOAT32 as float32, FLOAT64 as float64
from ..core.errors import ArgumentError, TraceError
from ..tensors.tensor import Tensor, as_tensor
from ..dispatch import api as tc

_PARAMS = "params"
# Every tc.optim hyper-parameter: a group naming one its optimizer does not take (betas for
# SGD) is a mistake; other extra keys (a user's "name", a scheduler's "initial_lr") are kept.
_HYPER_PARAMETERS = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "betas", "eps",
                     "amsgrad", "alpha", "centered", "lr_decay", "initial_accumulator_value"}
_FLAGS = {"nesterov", "maximize", "amsgrad", "centered"}     # the hyper-parameters that are bools
MASTER = "master_param"      # a half parameter's float32 copy, under master_weights


def _is_tensor_leaf(x: Any) -> bool:
    return isinstance(x, (Tensor, np.ndarray, np.generic))


def _tensor_or_none(x: Any) -> bool:
    """Leaves of params, grads and state: None too, so that a module's absent bias, and
    tc.grad's None for a buffer, keep their places (those leaves are not optimized)."""
    return x is None or _is_tensor_leaf(x)


def scalar(value: Any, dtype=float64) -> Tensor:
    """A hyper-parameter as a 0-d tensor: Python floats, NumPy scalars and 0-d tensors
    alike, traced or not.  The scalar arithmetic of a step (bias corrections, lr / ...)
    runs in float64, as PyTorch does it in Python floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = np.float64(value)          # not through float32 (as_tensor's width for a float)
    t = as_tensor(value)
    if t.ndim != 0:
        raise ArgumentError(f"a learning rate or step count must be a scalar, got a tensor of shape {t.shape}")
    return t if t.dtype == dtype else t.to(dtype)


def coef(value: Any, like: Tensor) -> Any:
    """A scalar coefficient in the dtype of the tensor it multiplies (PyTorch casts a
    Python scalar to the tensor's dtype before the elementwise kernel)."""
    return value.to(like.dtype) if isinstance(value, Tensor) else value


def lerp(start: Tensor, end: Tensor, weight: float) -> Tensor:
    """torch.lerp with a Python weight: its two formulas, chosen by the weight, so that
    the rounding matches (exp_avg.lerp_(grad, 1 - beta1) in Adam)."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1 - weight)


def _write(param: Tensor, value: Tensor) -> None:
    """Store an eager update into `param` (it stays a leaf that requires grad)."""
    with no_grad():
        param.copy_(value)


class Optimizer:
    """Base class of tc.optim's optimizers (torch.optim.Optimizer's interface)."""

    def __init__(self, params: Any, defaults: dict[str, Any], master_weights: bool = False) -> None:
        name = type(self).__name__
        self._check(defaults, f"{name}(...)")
        if not isinstance(master_weights, bool):
            raise ArgumentError(f"{name}: master_weights must be True or False, got {master_weights!r}")
        self.master_weights = master_weights
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self.param_groups: list[dict[str, Any]] = []
        if params is None:               # functional use only: init/update take the params
            self.param_groups.append(dict(self.defaults, params=[]))
            return
        if isinstance(params, (Tensor, np.ndarray)) or not isinstance(params, Iterable):
            raise ArgumentError(f"{name}: params must be an iterable of tensors or of param-group "
                                f"dicts, got a {type(params).__name__}")
        if isinstance(params, dict) and _PARAMS not in params:
            raise ArgumentError(f"{name}: params is a dict without a 'params' entry; pass its tensors "
                                "(list(d.values())), or a list of param-group dicts")
        params = list(params)
        if not params:
            raise ArgumentError(f"{name}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{_PARAMS: params}]
        for group in groups:
            self.add_param_group(group)

    # ------------------------------------------------------------------ subclass interface
    def _check(self, hyper: dict[str, Any], where: str) -> None:
        """Raise ArgumentError for a hyper-parameter out of its range (`where` names the call)."""
        non_negative(hyper, "lr", where)

    def _buffer_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The per-parameter state tensors this group's settings need (PyTorch's names)."""
        return ()

    def _init_buffer(self, name: str, param: Tensor, group: dict[str, Any]) -> Tensor:
        return tc.zeros_like(param)

    def _rule(self, param: Tensor, grad: Tensor, buffers: dict[str, Tensor], step: Tensor,
              lr: Tensor, group: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """The new value of `param` and its new buffers.  `step` (float32, 0-d) already
        counts this step, `lr` is a float64 0-d tensor, `group` holds the other
        hyper-parameters as Python values."""
        raise NotImplementedError

    # ------------------------------------------------------------------ param groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        name = type(self).__name__
        where = f"{name}: param_groups[{len(self.param_groups)}]"
        if not isinstance(param_group, dict) or _PARAMS not in param_group:
            raise ArgumentError(f"{where} must be a dict with a 'params' entry, got {param_group!r:.80}")
        params = param_group[_PARAMS]
        params = [params] if isinstance(params, Tensor) else list(params)
        foreign = (set(param_group) & _HYPER_PARAMETERS) - set(self.defaults)
        if foreign:
            raise ArgumentError(f"{where} has hyper-parameter(s) {sorted(foreign)} that {name} does not "
                                f"take; {name} takes {sorted(self.defaults)}")
        seen = {id(p) for g in self.param_groups for p in g[_PARAMS]}
        for i, p in enumerate(params):
            _check_param(p, f"{where}['params'][{i}]")
            if id(p) in seen:
                raise ArgumentError(f"{where}['params'][{i}] appears more than once among the "
                                    "optimizer's parameters")
            seen.add(id(p))
        group = dict(self.defaults)
        group.update(param_group)
        group[_PARAMS] = params
        self._check(group, where)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group[_PARAMS]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    with no_grad():
                        p.grad.zero_()

    # ------------------------------------------------------------------ eager step
    def step(self, closure=None):
        """One update of every parameter that has a `.grad`, in place (PyTorch's step)."""
        from ..dispatch import tracer
        if tracer.current() is not None:
            # Its buffers would keep traced values past the end of the trace.
            raise TraceError(f"{type(self).__name__}.step() updates tensors and optimizer state in place "
                             "and cannot run inside tc.trace; in a traced train step use the pure form: "
                             "params, state = opt.update(grads, state, params) with state = opt.init(params)")
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                lr = scalar(group["lr"])
                names = self._buffer_names(group)
                for p in group[_PARAMS]:
                    if p.grad is None:
                        continue
                    state = self.state.get(p)
                    if not state:
                        state = self.state[p] = self._fresh_state(p, group)
                    state["step"] = state["step"] + 1
                    buffers = {n: state[n] for n in names}
                    value, buffers, master = self._update_one(p.detach(), p.grad, buffers, state.get(MASTER),
                                                              state["step"], lr, group)
                    state.update(buffers)
                    if master is not None:
                        state[MASTER] = master
                    _write(p, value)
        return loss

    def _fresh_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        state = {"step": as_tensor(np.zeros((), np.float32))}
        master = self._master_copy(param)
        if master is not None:
            state[MASTER] = master
        for n in self._buffer_names(group):
            state[n] = self._init_buffer(n, param.detach() if master is None else master, group)
        return state

    def _master_copy(self, param: Tensor | None) -> Tensor | None:
        """The float32 copy a parameter steps through, or None where it steps itself."""
        if not self.master_weights or param is None or not param.dtype.is_half:
            return None
        return param.detach().to(float32)

    def _update_one(self, param: Tensor, grad: Tensor, buffers: dict[str, Tensor], master: Tensor | None,
                    step: Tensor, lr: Tensor, group: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor], Tensor | None]:
        """(new param, new buffers, new master copy or None): the rule, on the master copy
        where there is one (the module docstring)."""
        if master is None:
            value, buffers = self._rule(param, grad, buffers, step, lr, group)
            return value, buffers, None
        value, buffers = self._rule(master, grad.to(master.dtype), buffers, step, lr, group)
        return value.to(param.dtype), buffers, value

    # ------------------------------------------------------------------ functional
    def init(self, params: Any) -> dict[str, Any]:
        """The optimizer state for a pytree of parameters (a dict of arrays, a list, ...):
        {"step": 0-d float32, "lr": 0-d float64, one pytree like `params` per buffer}.
        Every leaf is a tensor, so the state can be passed to (and donated to) a traced step."""
        leaves, structure = self._leaves(params, "params")
        wanted = [p is not None and not constant      # a module's buffers are not optimized
                  for p, constant in zip(leaves, pytree.constant_leaves(structure))]
        group = self.defaults
        state: dict[str, Any] = {"step": as_tensor(np.zeros((), np.float32)),
                                 "lr": scalar(group["lr"])}
        masters = [self._master_copy(p) if w else None for p, w in zip(leaves, wanted)]
        if self.master_weights:
            state[MASTER] = pytree.unflatten(structure, masters)
        for n in self._buffer_names(group):
            state[n] = pytree.unflatten(structure, [self._init_buffer(n, p if m is None else m, group) if w else None
                                                    for p, m, w in zip(leaves, masters, wanted)])
        return state

    def update(self, grads: Any, state: dict[str, Any], params: Any, lr: Any = None) -> tuple[Any, dict[str, Any]]:
        """(new_params, new_state): one step, pure, with the constructor's hyper-parameters.
        `lr` (a NumPy scalar or 0-d tensor, e.g. from a scheduler) replaces the state's lr
        and is kept in the new state; as data, a new value does not retrace a traced step."""
        p_leaves, structure = self._leaves(params, "params")
        g_leaves, g_structure = self._leaves(grads, "grads")
        if g_structure != structure:
            raise ArgumentError(f"{type(self).__name__}.update: grads and params are different pytrees "
                                f"({len(g_leaves)} vs {len(p_leaves)} leaves); pass the gradient of "
                                "each parameter, in the same structure")
        group = self.defaults
        names = self._buffer_names(group)
        self._check_state(state, names)
        buffer_leaves = {}
        for n in names:
            leaves, s = self._leaves(state[n], f"state[{n!r}]")
            if s != structure:
                raise ArgumentError(f"{type(self).__name__}.update: state[{n!r}] does not have the "
                                    "structure of params; make the state with init(params)")
            buffer_leaves[n] = leaves
        masters = self._state_masters(state, structure, len(p_leaves))
        step = as_tensor(state["step"]) + 1
        lr = scalar(state["lr"] if lr is None else lr)
        new_params, new_buffers, new_masters = [], {n: [] for n in names}, list(masters)
        for i, (p, g) in enumerate(zip(p_leaves, g_leaves)):
            if p is None or g is None:          # no parameter here, or a buffer (tc.grad gives None)
                new_params.append(p)
                for n in names:
                    new_buffers[n].append(buffer_leaves[n][i])
                continue
            value, buffers, new_masters[i] = self._update_one(p, g, {n: buffer_leaves[n][i] for n in names},
                                                              masters[i], step, lr, group)
            new_params.append(value)
            for n in names:
                new_buffers[n].append(buffers[n])
        new_state: dict[str, Any] = {"step": step, "lr": lr}
        if self.master_weights:
            new_state[MASTER] = pytree.unflatten(structure, new_masters)
        for n in names:
            new_state[n] = pytree.unflatten(structure, new_buffers[n])
        return pytree.unflatten(structure, new_params), new_state

    def _state_masters(self, state: dict[str, Any], structure: Any, n: int) -> list[Tensor | None]:
        """The master copies in a functional state, one per parameter leaf (None: none)."""
        if not self.master_weights:
            return [None] * n
        name = type(self).__name__
        if MASTER not in state:
            raise ArgumentError(f"{name}.update: the state has no {MASTER!r}; with master_weights=True "
                                f"make it with {name}.init(params)")
        leaves, s = pytree.flatten(state[MASTER], _tensor_or_none)
        if s != structure:
            raise ArgumentError(f"{name}.update: state[{MASTER!r}] does not have the structure of params; "
                                "make the state with init(params)")
        return [None if x is None else as_tensor(x) for x in leaves]

    def _leaves(self, tree: Any, what: str) -> tuple[list[Tensor], Any]:
        leaves, structure = pytree.flatten(tree, _tensor_or_none)
        if not any(x is not None for x in leaves):
            raise ArgumentError(f"{type(self).__name__}: {what} holds no tensors (got {type(tree).__name__})")
        return [None if x is None else as_tensor(x) for x in leaves], structure

    def _check_state(self, state: Any, names: tuple[str, ...]) -> None:
        missing = [k for k in ("step", "lr", *names) if not isinstance(state, dict) or k not in state]
        if missing:
            raise ArgumentError(f"{type(self).__name__}.update: the state has no {missing}; make it with "
                                f"{type(self).__name__}.init(params) with the same hyper-parameters")

    # ------------------------------------------------------------------ state_dict
    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: "state" keyed by the parameter's index across all groups,
        "param_groups" with "params" as those indices."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group[_PARAMS]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != _PARAMS}, _PARAMS: ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the state and hyper-parameters of `state_dict` (from state_dict(), here or
        from torch.optim's optimizer of the same kind); raises ArgumentError, naming the
        group, parameter index or buffer, when it does not fit this optimizer's parameters."""
        name = type(self).__name__
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ArgumentError(f"{name}.load_state_dict: expected a dict with keys 'state' and "
                                f"'param_groups', got {type(state_dict).__name__}"
                                + (f" with keys {sorted(map(str, state_dict))}" if isinstance(state_dict, dict) else ""))
        saved_groups = state_dict["param_groups"]
        if not isinstance(saved_groups, (list, tuple)) or not isinstance(state_dict["state"], dict):
            raise ArgumentError(f"{name}.load_state_dict: expected 'param_groups' a list and 'state' a dict, "
                                f"got {type(saved_groups).__name__} and {type(state_dict['state']).__name__}")
        if len(saved_groups) != len(self.param_groups):
            raise ArgumentError(f"{name}.load_state_dict: the state dict has {len(saved_groups)} param "
                                f"group(s), the optimizer has {len(self.param_groups)}")
        by_index: dict[int, tuple[Tensor, dict]] = {}
        for gi, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            self._check_saved_group(saved, f"{name}.load_state_dict: param_groups[{gi}]")
            if len(saved[_PARAMS]) != len(group[_PARAMS]):
                raise ArgumentError(f"{name}.load_state_dict: param_groups[{gi}] has {len(saved[_PARAMS])} "
                                    f"parameter(s) in the state dict, {len(group[_PARAMS])} in the optimizer")
            for index, p in zip(saved[_PARAMS], group[_PARAMS]):
                by_index[index] = (p, saved)
        new_state: dict[Tensor, dict[str, Tensor]] = {}
        for index, saved_state in state_dict["state"].items():
            if index not in by_index:
                raise ArgumentError(f"{name}.load_state_dict: state[{index!r}] belongs to no parameter "
                                    f"(the param groups list {sorted(by_index)})")
            p, saved_group = by_index[index]
            merged = {**self.defaults, **{k: v for k, v in saved_group.items() if k != _PARAMS}}
            new_state[p] = self._loaded_param_state(p, saved_state, merged, f"state[{index}]")
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != _PARAMS})
        self.state = new_state

    def _check_saved_group(self, saved: Any, where: str) -> None:
        """Raise ArgumentError, naming the group, key and type, for a saved param group that
        this optimizer could not step with: not a dict of a 'params' list, or a
        hyper-parameter of the wrong type or range (a string lr would fail only at the
        next step(), far from the file it came from)."""
        if not isinstance(saved, dict) or not isinstance(saved.get(_PARAMS), (list, tuple)):
            raise ArgumentError(f"{where} must be a dict with a 'params' list, got {saved!r:.80}")
        merged = {**self.defaults, **{k: v for k, v in saved.items() if k != _PARAMS}}
        for key in sorted(_FLAGS & set(merged)):
            if not isinstance(merged[key], (bool, np.bool_)):
                raise ArgumentError(f"{where}: {key} must be a bool, got {merged[key]!r} "
                                    f"({type(merged[key]).__name__})")
        self._check(merged, where)

    def _loaded_param_state(self, p: Tensor, saved: dict, group: dict, where: str) -> dict[str, Tensor]:
        name = type(self).__name__
        out: dict[str, Tensor] = {}
        master = self._master_copy(p)
        if master is not None and saved.get(MASTER) is not None:     # (else: from the parameter)
            master = _saved_like(saved[MASTER], master, f"{name}.load_state_dict: {where}[{MASTER!r}]")
        if master is not None:
            out[MASTER] = master
        for n in self._buffer_names(group):
            if saved.get(n) is None:
                raise ArgumentError(f"{name}.load_state_dict: {where} has no {n!r} (it has {sorted(saved)})")
            out[n] = _saved_like(saved[n], p if master is None else master, f"{name}.load_state_dict: {where}[{n!r}]")
        step = saved.get("step")
        # torch's SGD keeps no step count; a saved momentum buffer means a step was taken.
        out["step"] = as_tensor(np.float32(1 if step is None else float(_host(step))))
        return out

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != _PARAMS]
        return "\n".join(lines + [")"])


def _saved_like(saved: Any, like: Tensor, where: str) -> Tensor:
    """A saved state tensor as a fresh tensor of `like`'s dtype, its shape checked."""
    t = as_tensor(_host(saved))
    if tuple(t.shape) != tuple(like.shape):
        raise ArgumentError(f"{where} has shape {tuple(t.shape)}, but its parameter has shape {tuple(like.shape)}")
    return t.to(like.dtype).clone()


def _host(x: Any) -> Any:
    """A value from a saved state dict, where a torch.Tensor is as good as an array."""
    if hasattr(x, "detach") and not isinstance(x, Tensor):
        return x.detach().cpu().numpy()
    return x


def _check_param(p: Any, where: str) -> None:
    if not isinstance(p, Tensor):
        raise ArgumentError(f"{where} is a {type(p).__name__}; an optimizer takes tc.Tensors that require "
                            "grad (tc.tensor(array, requires_grad=True)); for arrays in a pytree use "
                            "the functional init/update")
    if not p.dtype.is_floating_point:
        raise ArgumentError(f"{where} has dtype {p.dtype.label}; only floating-point tensors can be optimized")
    if not p.requires_grad:
        raise ArgumentError(f"{where} does not require grad: call p.requires_grad_() first")
    if not p.is_leaf:
        raise ArgumentError(f"{where} is not a leaf tensor (it was computed by {type(p.grad_fn).__name__}); "
                            "optimize the tensor it came from, or p.detach().requires_grad_()")


# ---------------------------------------------------------------------- hyper-parameter checks

def _number(hyper: dict, key: str, where: str) -> float:
    value = hyper[key]
    if isinstance(value, Tensor) and value.ndim == 0 and not value.is_traced:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"{where}: {key} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def non_negative(hyper: dict, key: str, where: str) -> None:
    if not _number(hyper, key, where) >= 0.0:
        raise ArgumentError(f"{where}: invalid {key} {hyper[key]!r}; it must be >= 0")


def _in_unit_interval(value: Any, what: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ArgumentError(f"{where}: {what} must be a number, got {value!r} ({type(value).__name__})")
    if not 0.0 <= value < 1.0:
        raise ArgumentError(f"{where}: invalid {what} {value!r}; it must be in [0, 1)")


def check_betas(hyper: dict, where: str) -> None:
    betas = hyper["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ArgumentError(f"{where}: betas must be a pair (beta1, beta2), got {betas!r}")
    _in_unit_interval(betas[0], "beta parameter at index 0", where)
    _in_unit_interval(betas[1], "beta parameter at index 1", where)


__all__ = ["Optimizer"]
