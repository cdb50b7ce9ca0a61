"""The optimization pipeline run on every traced graph: a plain list of named passes.

decompose -> widen_half -> fold -> simplify -> summed_products -> narrow_products -> control
-> cse -> dce (see tracecomp/ir/passes for each pass; widen_half leaves half-precision types
to casts, views and data movement; summed_products makes a batch-summed product one product
over rows, narrow_products lets a matmul of widened half tensors read them through views;
control rewrites loops and branches after folding made their predicates constant,
before CSE merges the ops it hoisted and DCE drops what it left unused).
Every pass's result is verified when TRACECOMP_VERIFY=1 is set (the test suite sets it);
the final graph is always verified, so a backend only ever receives a verified graph.
"""
from __future__ import annotations

import functools
import os

from .decompose import decompose
from ..ir import Graph
from ..ir.passes import PassManager, control, cse, dce, fold_constants, narrow_products, simplify, summed_products, widen_half
from ..ir.verifier import verify
from ..ops import numpy_kernels


def _verify_each() -> bool:
    return os.environ.get("TRACECOMP_VERIFY") == "1"


def pipeline(verify_each: bool | None = None, record: bool = False) -> PassManager:
    """The passes `optimize` runs; `record=True` keeps the text after each (for the CLI)."""
    return PassManager([
        ("decompose", decompose),
        ("widen_half", widen_half),
        ("fold", functools.partial(fold_constants, evaluate=numpy_kernels.run)),
        ("simplify", simplify),
        ("summed_products", summed_products),
        ("narrow_products", narrow_products),
        ("control", control),
        ("cse", cse),
        ("dce", dce),
    ], verify_each=_verify_each() if verify_each is None else verify_each, record=record)


def optimize(graph: Graph) -> Graph:
    manager = pipeline()
    graph = manager.run(graph)
    if not manager.verify_each:
        verify(graph)
    return graph
