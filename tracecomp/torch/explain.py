"""tracecomp.torch.explain(model, *inputs): which ATen ops tracecomp compiles and which run in
PyTorch, for one run of the model, as torch._dynamo.explain reports graph breaks."""
from __future__ import annotations

import functools

import torch

from .backend import backend
from .report import Explanation, GraphReport


def _leaves(outputs: list) -> list:
    """The tensors the outputs' gradients would accumulate into (.grad leaves): the
    AccumulateGrad nodes of their autograd graph, whatever holds the tensors (a module's
    parameters, a closure, the inputs)."""
    leaves, seen, stack = [], set(), [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


def run_once(model, inputs: tuple, kwargs: dict, options: dict, **compile_options):
    """Run `model(*inputs, **kwargs)` once through torch.compile with the tracecomp backend
    and `options`, and, where an output needs gradients, its backward (torch.autograd.grad
    of the outputs' sum: the parameters' .grad stay as they are); the outputs."""
    compiled = torch.compile(model, backend=functools.partial(backend, options=options), **compile_options)
    out = compiled(*inputs, **kwargs)
    flat = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves = _leaves(flat)
    if leaves:
        total = sum(t.sum() for t in flat)
        torch.autograd.grad(total, leaves, allow_unused=True)
    return out


def explain(model, *inputs, **kwargs) -> Explanation:
    """Run `model(*inputs, **kwargs)` once through torch.compile with the tracecomp
    backend, and, where an output needs gradients, its backward (torch.autograd.grad of
    the outputs' sum: the parameters' .grad stay as they are); report every graph's
    compiled and fallen-back ops.  The model runs for real, so a BatchNorm in training
    mode moves its running statistics, as with torch._dynamo.explain."""
    reports: list[GraphReport] = []
    run_once(model, inputs, kwargs, {"report": reports.append})
    return Explanation(reports)
