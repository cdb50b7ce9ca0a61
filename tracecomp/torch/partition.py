"""Fallback, never failure: the nodes tracecomp cannot compile run in PyTorch, the rest compiled.

`split(gm, refused)` hands the graph to torch.fx's CapabilityBasedPartitioner with the
nodes that probe (importer.py) accepted as the supported ones.  Each partition becomes a
submodule of the returned GraphModule, and each submodule a `CompiledGraph`; the refused
nodes stay in the outer graph, which PyTorch runs as Python code calling ATen, and feed
the partitions their inputs.  The partitioner keeps the partitions free of cycles (no
partition needs its own output through a PyTorch node), so one graph may become several
compiled pieces around the nodes PyTorch runs.

`log_fallbacks` tells the user, once per op, reason and source line in the process (logger
"tracecomp.torch", a child of "tracecomp": TRACECOMP_LOG=1 shows it), which nodes PyTorch
runs and why, with the line of the user's model that the node comes from when the node's
`meta["stack_trace"]` records one.
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .importer import QUIET, CompiledGraph, user_frame

log = logging.getLogger("tracecomp.torch")

_logged: set = set()


class _Accepted(OperatorSupportBase):
    def __init__(self, refused: dict):
        super().__init__()
        self.refused = refused

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node not in self.refused


class CompiledModule(torch.nn.Module):
    """A partition as the outer GraphModule calls it (`self.fused_0(x, w)`)."""

    def __init__(self, compiled: CompiledGraph):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        return self.compiled(*args)


def split(gm: torch.fx.GraphModule, refused: dict, name: str, trace_options: dict | None = None,
          fallback: bool = True, cache: tuple | None = None) -> tuple[torch.fx.GraphModule, list[CompiledGraph]]:
    """`gm` with each largest group of accepted nodes (no cycles through PyTorch's nodes)
    replaced by a call of a CompiledGraph; the graph and the compiled pieces."""
    partitioner = CapabilityBasedPartitioner(gm, _Accepted(refused), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions, prefix="tracecomp_")
    pieces = []
    for child, module in list(fused.named_children()):
        if child.startswith("tracecomp_") and isinstance(module, torch.fx.GraphModule):
            compiled = CompiledGraph(module, f"{name}_{child.removeprefix('tracecomp_')}", trace_options, fallback,
                                     cache)
            setattr(fused, child, CompiledModule(compiled))
            pieces.append(compiled)
    fused.recompile()
    return fused, pieces


def user_line(node: torch.fx.Node) -> str | None:
    """`file:line in function: code` of the innermost frame of the node's recorded stack."""
    frame = user_frame(node)
    if frame is None:
        return None
    file, line, function, code = frame
    return f"{file}:{line} in {function}" + (f": {code}" if code else "")


def op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._schema.name.split('::')[1]}.{target._overloadname}" \
            if target._schema.name.startswith("aten::") else str(target)
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__qualname__", None) or str(target)


def log_fallbacks(refused: dict, graph_name: str) -> None:
    for node, why in refused.items():
        if why in QUIET or node.target is operator.getitem:
            continue
        line = user_line(node)
        key = (op_name(node), why, line)
        if key in _logged:
            continue
        _logged.add(key)
        log.warning("%s: %s runs in PyTorch: %s%s", graph_name, op_name(node), why,
                    f" (from {line})" if line else "")
