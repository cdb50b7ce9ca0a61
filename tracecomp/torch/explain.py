"""tracecomp.torch.explain(model, *inputs): which ATen ops tracecomp compiles and which run in
PyTorch, for one run of the model, as torch._dynamo.explain reports graph breaks."""
from __future__ import annotations

import functools

import torch

from .backend import backend
from .report import Explanation, GraphReport


def _leaves_needing_grad(model, inputs) -> list:
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if isinstance(model, torch.nn.Module):
        leaves += [p for p in model.parameters() if p.requires_grad]
    return leaves


def explain(model, *inputs, **kwargs) -> Explanation:
    """Run `model(*inputs, **kwargs)` once through torch.compile with the tracecomp
    backend, and, where an output needs gradients, its backward (torch.autograd.grad of
    the outputs' sum: the parameters' .grad stay as they are); report every graph's
    compiled and fallen-back ops.  The model runs for real, so a BatchNorm in training
    mode moves its running statistics, as with torch._dynamo.explain."""
    reports: list[GraphReport] = []
    compiled = torch.compile(model, backend=functools.partial(backend, options={"report": reports.append}))
    out = compiled(*inputs, **kwargs)
    flat = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves = _leaves_needing_grad(model, inputs)
    if flat and leaves and torch.is_grad_enabled():
        total = sum(t.sum() for t in flat)
        torch.autograd.grad(total, leaves, allow_unused=True)
    return Explanation(reports)
