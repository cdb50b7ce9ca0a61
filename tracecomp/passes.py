"""The optimization pipeline run on every traced graph (see ir/passes for the passes)."""
from __future__ import annotations

from .decompose import decompose
from .ir import Graph


def optimize(graph: Graph) -> Graph:
    return decompose(graph)
