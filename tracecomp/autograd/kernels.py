"""The Autograd and ForwardAD dispatch keys' kernels.

Autograd: when a differentiable input requires grad, run the op below this key, then give
its outputs a FormulaNode (grad_fn) whose next edges lead to the inputs' nodes.
ForwardAD: when an input carries a tangent, run the op below this key, then compute the
output's tangent from the op's `result:` formula (or auto_linear / auto_element_wise).
Composite ops never get here: the dispatcher runs their programs, so both see only their
primitive ops.
"""
from __future__ import annotations

from typing import Any

from ..dispatch.batching import top_level
from ..dispatch.dispatcher import DispatchKey, dispatcher, level_of
from ..tensors.results import map_tensors, outputs as result_tensors
from ..ops.table import OpDef
from .derivatives import default_derivatives
from .formulas import evaluate, output_env
from .node import AutogradError, node_class
from ..core.locations import user_location
from ..dispatch import api as tc
from ..dispatch.tracer import current
from ..tensors.tensor import Tensor


def _slots(op: OpDef, args: dict[str, Any]) -> list[tuple[str, int | None]]:
    """One slot per Tensor passed to a Tensor argument (Tensor[] elements each get one)."""
    slots = []
    for a in op.schema.tensor_arguments:
        v = args[a.name]
        if isinstance(v, Tensor):
            slots.append((a.name, None))
        elif isinstance(v, list):
            slots.extend((a.name, i) for i in range(len(v)))
    return slots


def _slot_tensor(args, slot):
    name, index = slot
    return args[name] if index is None else args[name][index]


def autograd_kernel(op: OpDef, args: dict[str, Any]):
    derivative = default_derivatives().get(op.full_name)
    slots = _slots(op, args)
    non_diff = set(derivative.non_differentiable) if derivative else set()
    top = top_level(args)         # under tc.vmap, tensors of outer levels are constants here
    wants = [_slot_tensor(args, s).requires_grad and s[0] not in non_diff and level_of(_slot_tensor(args, s)) == top
             and _slot_tensor(args, s).dtype.is_floating_point for s in slots]
    result = dispatcher.redispatch(op, args, DispatchKey.Autograd)
    if not any(wants):
        return result
    if derivative is None:
        raise AutogradError(f"{op.full_name}: no derivative formula in derivatives.yaml, "
                            "but an input requires grad")
    from .backward import gradient_edge
    edges = [gradient_edge(_slot_tensor(args, s)) if w else None for s, w in zip(slots, wants)]
    outputs = result_tensors(result)
    ctx = current()       # inside a backward pass being traced, the location it overrides
    loc = ctx.location() if ctx is not None else user_location()
    node = node_class(derivative.node_name)(derivative, args, outputs, slots, edges, loc)
    for i, (out, diff) in enumerate(zip(outputs, derivative.differentiable_outputs() * len(outputs))):
        if diff and out.dtype.is_floating_point:
            out.requires_grad = True
            out.grad_fn = node
            out._output_nr = i
    return result


def primal(t):
    """`t` without its tangent (same value and autograd history), for use inside formulas."""
    from .backward import gradient_edge
    if t.requires_grad and t.grad_fn is None:
        gradient_edge(t)          # create the leaf's accumulator on `t` itself, then share it
    p = Tensor(t._data, t._type, t._value, t._trace, t.requires_grad)
    p.grad_fn, p._output_nr, p._accumulator = t.grad_fn, t._output_nr, t._accumulator
    p._batch = t._batch
    return p


def _tangent(t, top: int):
    """t's tangent at this level (a tensor of an outer tc.vmap level is a constant here:
    its tangent is handled when the op runs on the whole batch)."""
    return t._tangent if t._tangent is not None and level_of(t) == top else tc.zeros_like(t)


def forward_ad_kernel(op: OpDef, args: dict[str, Any]):
    top = top_level(args)
    stripped = map_tensors(args, lambda t: primal(t) if level_of(t) == top else t)
    result = dispatcher.call(op, stripped)
    outputs = result_tensors(result)
    if not outputs or not outputs[0].dtype.is_floating_point:
        return result
    _save_duals(outputs, args, stripped)
    derivative = default_derivatives().get(op.full_name)
    if derivative is None or derivative.forward is None:
        raise AutogradError(f"{op.full_name}: no forward-mode formula ('result:') in derivatives.yaml")
    tangent = _forward_tangent(op, derivative, args, stripped, outputs, top)
    if op.schema.returns[0].type.is_list or len(outputs) > 1 and isinstance(tangent, tuple):
        for out, t in zip(outputs, tangent):       # split's pieces, or a tangent per result
            out._tangent = t
    else:
        outputs[0]._tangent = tangent
    return result


def _save_duals(outputs, args, stripped) -> None:
    """The Autograd node made below this key saved the primals; let it save the tensors with
    their tangents instead, so that its backward formulas carry tangents (forward-over-reverse,
    e.g. tc.jvp(tc.grad(f), ...))."""
    node = getattr(outputs[0], "grad_fn", None)
    saved = getattr(node, "saved", None)
    if saved is not None and saved.keys() == args.keys() and all(saved[k] is stripped[k] for k in args):
        node.saved = dict(args)


def _forward_tangent(op: OpDef, derivative, args, stripped, outputs, top: int):
    env = dict(stripped)
    env.update(output_env(op, outputs))
    for k, v in args.items():
        env[f"{k}_p"] = stripped[k]
        if isinstance(v, Tensor):
            env[f"{k}_t"] = _tangent(v, top)
        elif isinstance(v, list) and v and isinstance(v[0], Tensor):
            env[f"{k}_t"] = [_tangent(t, top) for t in v]
    for a in op.schema.tensor_arguments:           # a Python number's tangent is 0; None stays None
        env.setdefault(f"{a.name}_t", None if args[a.name] is None else 0)
    if derivative.forward == "auto_linear":
        linear_args = {k: env.get(f"{k}_t", v) for k, v in stripped.items()}
        tangents = result_tensors(dispatcher.call(op, linear_args))
        return tangents if op.schema.returns[0].type.is_list else tangents[0]
    if derivative.forward == "auto_element_wise":
        env["grad"] = env["self_t"]
        env["grads"] = [env["self_t"]]
        env["grad_input_mask"] = [True]
        return evaluate(derivative.formula_for("self").expr, env)
    return evaluate(derivative.forward, env)
