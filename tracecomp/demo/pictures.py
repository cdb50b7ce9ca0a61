"""Pictures of a traced function's graphs: DOT text per stage, and SVG/PNG through Graphviz.

Stage "graph" marks the ops the autograd engine recorded (`Lowered.backward_ops`); stage
"backward" is made of those ops only; stage "optimized" also draws each fused kernel of
the scheduled program as a cluster, and marks the ops whose origin (their location, which
every pass keeps) is the backward pass.
"""
from __future__ import annotations

import shutil
import subprocess

from ..core.errors import BackendError, TracecompError
from ..ir import Op
from ..ir.nx import to_dot

PICTURE_STAGES = ("graph", "backward", "optimized")
INSTALL_GRAPHVIZ = "Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz"


class GraphvizMissing(TracecompError, RuntimeError):
    """Graphviz's `dot` is not on PATH."""


def stage_dot(lowered, stage: str) -> str:
    """DOT text for one graph stage of a `Lowered` (tc.trace(fn).lower(...))."""
    if stage == "graph":
        return to_dot(lowered.graph, backward=lowered.backward_ops)
    if stage == "backward":
        graph = lowered.backward
        return to_dot(graph, backward=set(graph.ops))
    if stage == "optimized":
        return to_dot(lowered.optimized, kernels=lowered.program.kernel_ops,
                      backward=optimized_backward_ops(lowered))
    raise BackendError(f"no picture for stage {stage!r}; graph stages: {', '.join(PICTURE_STAGES)}")


def optimized_backward_ops(lowered) -> set[Op]:
    """The ops of `lowered.optimized` made from ops the autograd engine recorded."""
    return {op for op in lowered.optimized.ops if op.loc is not None and op.loc.is_backward}


def have_graphviz() -> bool:
    return shutil.which("dot") is not None


def render(dot: str, fmt: str) -> bytes:
    """DOT text drawn by Graphviz as `fmt` ("svg" or "png")."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(f"drawing {fmt} needs Graphviz's 'dot' ({INSTALL_GRAPHVIZ}); "
                              "the DOT text itself needs nothing")
    r = subprocess.run([exe, f"-T{fmt}"], input=dot.encode(), capture_output=True)
    if r.returncode != 0:
        raise BackendError(f"Graphviz's dot -T{fmt} failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout
