"""tracecomp as a torch.compile backend: existing PyTorch models, unchanged.

    import torch
    compiled = torch.compile(model, backend="tracecomp")   # the entry point, or import tracecomp.torch
    loss = compiled(x).sum(); loss.backward()              # forward and backward compiled by tracecomp

backend.py: Dynamo's graph through AOTAutograd (decompositions, forward/backward graphs);
aten.py: the table from ATen overloads to ops.yaml's ops; importer.py: an ATen graph as a
tc.trace'd function.  Only this package imports torch (`import tracecomp` does
not): torch is a test-only dependency of tracecomp.
"""
from __future__ import annotations

from .aten import Rule, rules
from .backend import backend, counts, decompositions, register
from .importer import CompiledGraph

__all__ = ["CompiledGraph", "Rule", "backend", "counts", "decompositions", "register", "rules"]

register()
