"""Pictures of a traced function's graphs: DOT text per stage, and SVG/PNG through Graphviz.

Stage "graph" marks the ops the autograd engine recorded (`Lowered.backward_ops`); stage
"backward" is made of those ops only; stage "optimized" also draws each fused kernel of
the scheduled program as a cluster.  The optimization passes copy ops into new graphs, so
which optimized op came from a backward op is found by optimizing a copy of the traced
graph whose locations are op numbers: every pass gives what it makes the location of the
op it came from (see `optimized_backward_ops`).
"""
from __future__ import annotations

import shutil
import subprocess
import warnings

from .errors import BackendError, TracecompError
from .ir import Graph, Op
from .ir.nx import to_dot
from .ir.types import Location

PICTURE_STAGES = ("graph", "backward", "optimized")
PROVENANCE_FILE = "<op number>"
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
    if not lowered.backward_ops:
        return set()
    from .passes import optimize
    numbered = _with_op_numbers(lowered.graph)
    again = optimize(numbered)
    if [op.name for op in again.ops] != [op.name for op in lowered.optimized.ops]:
        warnings.warn("tracecomp: re-optimizing the traced graph gave different ops; the "
                      "picture does not mark backward ops", stacklevel=2)
        return set()
    backward = {i for i, op in enumerate(lowered.graph.ops) if op in lowered.backward_ops}
    return {op for op, twin in zip(lowered.optimized.ops, again.ops)
            if twin.loc is not None and twin.loc.file == PROVENANCE_FILE and twin.loc.line in backward}


def _with_op_numbers(graph: Graph) -> Graph:
    """A copy of `graph` whose op number i has the location PROVENANCE_FILE:i."""
    copy = Graph(graph.name, [v.type for v in graph.inputs])
    mapping = dict(zip(graph.inputs, copy.inputs))
    for i, op in enumerate(graph.ops):
        new = copy.add_op(op.name, [mapping[v] for v in op.operands], op.attrs,
                          [r.type for r in op.results], Location(PROVENANCE_FILE, i))
        mapping.update(zip(op.results, new.results))
    copy.outputs = [mapping[v] for v in graph.outputs]
    return copy


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
