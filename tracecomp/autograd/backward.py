"""Applying a node's formulas (apply_formulas) and the backward engine (run_backward).

The engine follows seed 002: count, for every node reachable from the roots, how many
edges lead into it; run a node once all of its incoming gradients have arrived (summing
them), pass its results along its next_edges; leaves accumulate into `.grad`, or, for
functional `tc.grad`, the gradients reaching the requested inputs are captured instead.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Any

from ..core.errors import TracecompError, add_location
from .formulas import evaluate, output_env
from .grad_mode import set_grad_enabled
from .helpers import sum_to
from .node import AccumulateGrad, AutogradError, Edge, FormulaNode, Node
from ..dispatch import api as tc


def _zeros_like(t):
    return tc.zeros_like(t)


def apply_formulas(node: FormulaNode, grads: list) -> list:
    """Gradients for the node's input slots (None where none is needed or defined)."""
    d = node.derivative
    diff = d.differentiable_outputs()
    if len(diff) < len(grads):                 # Tensor[] returns (split): every piece
        diff = diff * len(grads)
    if all(g is None for g, ok in zip(grads, diff) if ok):
        return [None] * len(node.slots)
    outputs = node.saved_outputs
    full = [g if g is not None else _zeros_like(o) for g, o in zip(grads, outputs)]
    env: dict[str, Any] = dict(node.saved)
    env.update(output_env(d.op, outputs))
    env["grad"] = full[0]
    env["grads"] = full
    env["grads_defined"] = [g is not None for g in grads]     # PyTorch's grads[i].defined()
    for r, g in zip(d.op.schema.returns, full):
        if r.name:
            env[f"grad_{r.name}"] = g
    if d.op.kind == "elementwise":
        env = {k: _widened(v) for k, v in env.items()}
    needed = {name for (name, _), edge in zip(node.slots, node.next_edges) if edge is not None}
    by_name: dict[str, Any] = {}
    for f in d.formulas:
        wanted = [name in needed for name in f.inputs]
        if not any(wanted):
            continue
        if f.expr is None:
            raise AutogradError(f"the derivative of {d.op.full_name} with respect to "
                                f"'{'/'.join(f.inputs)}' is not implemented: {f.not_implemented} "
                                f"(derivatives.yaml:{d.line})")
        env["grad_input_mask"] = wanted
        value = evaluate(f.expr, env)
        if len(f.inputs) == 1:
            by_name[f.inputs[0]] = value
        else:
            by_name.update(zip(f.inputs, value))
    out = []
    for (name, index), edge, typ in zip(node.slots, node.next_edges, node.input_types):
        g = by_name.get(name) if edge is not None else None
        if g is not None and index is not None:
            g = g[index]
        out.append(None if g is None else _conform(g, typ))
    return out


def _widened(v):
    """Half tensors (in a list too) as float32: an elementwise op's derivative formula then
    runs in float32 and _conform rounds it once, as PyTorch's backward kernels compute
    (tanh_backward, hardswish_backward, ...); op by op in the half dtype each step rounds."""
    if isinstance(v, list):
        return [_widened(x) for x in v]
    dtype = getattr(v, "dtype", None)
    return v.to(tc.float32) if dtype is not None and getattr(dtype, "is_half", False) else v


def _conform(grad, typ):
    """Reduce a gradient to its input's shape (undoing broadcasting) and dtype."""
    if tuple(grad.shape) != typ.shape:
        grad = sum_to(grad, typ.shape)
    if grad.dtype != typ.dtype:
        grad = grad.to(typ.dtype)
    return grad


def gradient_edge(t) -> Edge:
    """Where a gradient for tensor `t` goes: its grad_fn's slot, or its leaf accumulator."""
    if t.grad_fn is not None:
        return Edge(t.grad_fn, t._output_nr)
    if t._accumulator is None:
        t._accumulator = AccumulateGrad(t)
    return Edge(t._accumulator, 0)


def _dependencies(roots: list[Node]) -> dict[Node, int]:
    deps: dict[Node, int] = collections.defaultdict(int)
    seen, stack = set(roots), list(roots)
    while stack:
        node = stack.pop()
        for e in node.next_edges:
            if e is None:
                continue
            deps[e.node] += 1
            if e.node not in seen:
                seen.add(e.node)
                stack.append(e.node)
    return deps


def _needed(roots: list[Node], targets: set[Edge]) -> set[Node]:
    """Nodes on some path from a root to a captured edge (only these need to run).

    Iterative (a reverse walk from the nodes that feed a target), so that an unrolled
    loop thousands of nodes deep does not exhaust Python's recursion limit."""
    feeders: dict[Node, list[Node]] = collections.defaultdict(list)
    hit: set[Node] = set()
    seen, stack = set(roots), list(roots)
    while stack:
        node = stack.pop()
        for e in node.next_edges:
            if e is None:
                continue
            if e in targets:
                hit.add(node)
            feeders[e.node].append(node)
            if e.node not in seen:
                seen.add(e.node)
                stack.append(e.node)
    stack = list(hit)
    while stack:
        for n in feeders.get(stack.pop(), ()):
            if n not in hit:
                hit.add(n)
                stack.append(n)
    return hit


def _accumulate(buffer: list, i: int, g) -> None:
    buffer[i] = g if buffer[i] is None else buffer[i] + g


def run_backward(roots: list, grad_roots: list, retain_graph: bool = False,
                 create_graph: bool = False, inputs: list | None = None) -> list | None:
    """Backpropagate from `roots`; accumulate into leaves, or return grads for `inputs`."""
    edges = []
    for i, t in enumerate(roots):
        if not t.requires_grad:
            raise AutogradError(f"element {i} of the tensors to differentiate does not require grad "
                                "and has no grad_fn (did you forget requires_grad=True, or run under "
                                "tc.no_grad()?)")
        edges.append(gradient_edge(t))
    targets = {gradient_edge(t): k for k, t in enumerate(inputs)} if inputs is not None else None
    captured: list = [None] * len(inputs or [])
    root_nodes = list(dict.fromkeys(e.node for e in edges))
    deps = _dependencies(root_nodes)
    needed = _needed(root_nodes, set(targets)) if targets is not None else None
    buffers: dict[Node, list] = {}
    for e, g in zip(edges, grad_roots):
        with recorded_at(e.node):
            _accumulate(buffers.setdefault(e.node, [None] * e.node.num_outputs), e.input_nr, g)
    ready = collections.deque(n for n in root_nodes if deps[n] == 0)
    with set_grad_enabled(create_graph), _backward_phase():
        while ready:
            node = ready.popleft()
            grads = buffers.pop(node, [None] * node.num_outputs)
            run = needed is None or node in needed
            with recorded_at(node):            # the sums of gradients too
                _deliver(node, grads, targets, captured, create_graph)
                results = _run_node(node, grads, retain_graph) if run else [None] * len(node.next_edges)
                for e, g in zip(node.next_edges, results):
                    if e is not None and g is not None:
                        _accumulate(buffers.setdefault(e.node, [None] * e.node.num_outputs), e.input_nr, g)
            for e in node.next_edges:
                if e is None:
                    continue
                deps[e.node] -= 1
                if deps[e.node] == 0:
                    ready.append(e.node)
    return captured if inputs is not None else None


@contextlib.contextmanager
def _backward_phase():
    """Tell an active trace that the ops it records now belong to the backward pass."""
    from ..dispatch.tracer import current
    ctx = current()
    if ctx is not None:
        ctx.backward_depth += 1
    try:
        yield
    finally:
        if ctx is not None:
            ctx.backward_depth -= 1


def _deliver(node: Node, grads: list, targets, captured: list, create_graph: bool) -> None:
    """Hand gradients to captured inputs, retained non-leaf tensors and leaf `.grad`s."""
    for i, g in enumerate(grads):
        if g is None:
            continue
        if targets is not None and Edge(node, i) in targets:
            k = targets[Edge(node, i)]
            captured[k] = g if captured[k] is None else captured[k] + g
        kept = node.retained.get(i)
        if kept is not None:
            kept.grad = _detached(g, create_graph) if kept.grad is None else kept.grad + g
    if targets is None and isinstance(node, AccumulateGrad) and grads[0] is not None:
        var = node.variable
        g = _detached(grads[0], create_graph)
        var.grad = g if var.grad is None else var.grad + g


def _detached(g, create_graph: bool):
    return g if create_graph else g.detach()


def recorded_at(node: Node | None):
    """Ops an active trace records inside belong to the backward pass of `node`'s forward
    op: they get its origin (its line, the backward phase, the op they differentiate),
    not the frame that happens to run the engine (the `tracecomp` console script, say)."""
    from ..dispatch.tracer import current
    ctx = current()
    origin = node.origin if node is not None else None
    return contextlib.nullcontext() if ctx is None or origin is None else ctx.located(origin)


def _run_node(node: Node, grads: list, retain_graph: bool) -> list:
    try:
        return node.apply(grads)
    except TracecompError as e:
        if isinstance(e, AutogradError) or node.loc is None:
            raise
        raise add_location(e, f"{node.loc} (in {node.name()})") from None
    finally:
        if not retain_graph:
            node.release()
