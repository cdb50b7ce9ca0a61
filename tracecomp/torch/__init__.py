"""tracecomp as a torch.compile backend: existing PyTorch models, unchanged.

    import torch
    compiled = torch.compile(model, backend="tracecomp")   # the entry point, or import tracecomp.torch
    loss = compiled(x).sum(); loss.backward()              # forward and backward compiled by tracecomp
    print(tracecomp.torch.explain(model, x))               # which ATen ops compiled, which ran in PyTorch
    print(tracecomp.torch.lower(model, x).forward.as_text("optimized"))   # the imported graph, as tc.trace's

backend.py: Dynamo's graph through AOTAutograd (decompositions, forward/backward graphs);
aten.py: the table from ATen overloads to ops.yaml's ops; importer.py: an ATen graph as a
tc.trace'd function; partition.py: what tracecomp cannot compile runs in PyTorch;
report.py and explain.py: what compiled and what fell back; lowering.py: the imported graphs
as tc.trace's Lowered objects.  Only this package imports torch (`import tracecomp` does
not): torch is a test-only dependency of tracecomp.
"""
from __future__ import annotations

from .aten import Rule, rules
from .backend import backend, counts, decompositions, register
from .importer import CompiledGraph
from .explain import explain
from .lowering import TorchLowered, lower
from .report import Explanation, GraphReport

__all__ = ["CompiledGraph", "Explanation", "GraphReport", "Rule", "backend", "counts", "decompositions",
           "explain", "lower", "register", "rules", "TorchLowered"]

register()
