"""The torch.compile backend: Dynamo's FX graph through AOTAutograd into tracecomp.

    torch.compile(model, backend="tracecomp")
      Dynamo: the model's Python -> an FX graph of torch calls (parameters are inputs)
      AOTAutograd (aot_autograd below): functionalized ATen graphs, decomposed by
          `decompositions()`; a forward and a backward graph where the inputs need
          gradients, one inference graph otherwise (torch.no_grad())
      each graph -> probe (importer.py): the nodes tracecomp takes
          -> all of them: one CompiledGraph, a tc.trace of the graph replayed on tc tensors
          -> some: split (partition.py): compiled partitions inside a graph PyTorch runs

The decomposition table is Core ATen's (torch._decomp.core_aten_decompositions) without
the entries for the CPU flash-attention ops: tracecomp has both fused attention ops
(ops.yaml), and as shipped in PyTorch 2.13, Core ATen's entry for the forward returns
attention weights where the op returns the logsumexp while the backward still calls the
fused backward op, which gives gradients wrong by factors of 10 to 510 without an error
(issue 38).  Inductor leaves that op undecomposed, and so does tracecomp.

Options (`torch.compile(..., options={...})`, or keyword arguments of `backend`):
  strict        True: raise instead of falling back to PyTorch for any node (fullgraph-like)
  report        a callable receiving a GraphReport per graph (explain uses it)
  trace         keyword arguments for tc.trace (backend="interp", fastmath=True, ...)
  decompositions  a decomposition table replacing decompositions()
  cache         the compile cache for this model's graphs: False (off), True (on), or a
                folder (str or path: on, there); left out, tc.compile_cache's settings
  lowered       a callable receiving (GraphReport, Lowered) at each call of a graph that
                compiled whole (tracecomp.torch.lower uses it)
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from ..core.errors import ArgumentError, BackendError
from .importer import CompiledGraph, counts, probe
from .partition import QUIET, log_fallbacks, split
from .report import GraphReport

log = logging.getLogger("tracecomp.torch")

OPTIONS = ("strict", "report", "trace", "decompositions", "cache", "lowered")

# Ops that tracecomp takes whole, which Core ATen would decompose (see the docstring).
# eye: Core ATen's compares uint8 aranges (tracecomp has no uint8); ops.yaml's eye uses int64.
KEEP = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
        "eye")



def decompositions() -> dict:
    """Core ATen's decompositions minus the ops in KEEP."""
    table = core_aten_decompositions()
    packets = [getattr(torch.ops.aten, name) for name in KEEP if hasattr(torch.ops.aten, name)]
    keep = {getattr(p, overload) for p in packets for overload in p.overloads()}
    return {op: fn for op, fn in table.items() if op not in keep}


def _options(options: dict | None, kwargs: dict) -> dict:
    merged = {**(options or {}), **kwargs}
    merged.pop("mode", None)          # torch.compile's mode= names Inductor's presets
    unknown = sorted(set(merged) - set(OPTIONS))
    if unknown:
        raise ArgumentError(f"tracecomp backend: unknown option(s) {', '.join(unknown)} "
                            f"(it takes {', '.join(OPTIONS)})")
    if "cache" in merged:
        merged["cache"] = _cache_scope(merged["cache"])
    return merged


def _cache_scope(cache) -> tuple:
    """The `cache` option as compile_cache.scoped's (enabled, folder)."""
    if isinstance(cache, bool):
        return cache, None
    if isinstance(cache, (str, os.PathLike)) and str(cache):
        return True, os.fspath(cache)
    raise ArgumentError(f"tracecomp backend: option cache takes False, True or a folder, got {cache!r}")


def backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, **kwargs) -> Callable:
    """The torch.compile backend (`backend="tracecomp"`): returns the callable that runs
    Dynamo's graph `gm`, its forward and backward compiled by tracecomp."""
    opts = _options(options, kwargs)
    counts["dynamo"] += 1
    compilers = {kind: functools.partial(compile_graph, kind=kind, options=opts)
                 for kind in ("forward", "backward", "inference")}
    aot = aot_autograd(fw_compiler=compilers["forward"], bw_compiler=compilers["backward"],
                       inference_compiler=compilers["inference"],
                       decompositions=opts.get("decompositions") or decompositions())
    return aot(gm, example_inputs)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, kind: str, options: dict) -> Callable:
    """One ATen graph from AOTAutograd -> the boxed callable that runs it."""
    name = f"{kind}_{counts[kind]}"
    counts[kind] += 1
    try:
        refused = probe(gm)
    except Exception as e:           # noqa: BLE001 - a graph the importer cannot read runs in PyTorch
        if options.get("strict", False):
            raise
        log.warning("%s: tracecomp cannot import this graph (%s: %s); PyTorch runs it", name, type(e).__name__, e)
        return make_boxed_func(gm)
    report = GraphReport.of(gm, refused, name, kind)
    strict = options.get("strict", False)
    fallen = {n: why for n, why in refused.items() if why not in QUIET}
    if fallen and strict:
        lines = "\n".join(f"  {op}: {report.reasons[op]}" for op in sorted(report.fallback))
        raise BackendError(f"tracecomp (strict): {name} has ops tracecomp cannot compile:\n{lines}")
    log_fallbacks(refused, name)
    trace_options, cache = options.get("trace"), options.get("cache")
    if not refused:
        compiled: Any = CompiledGraph(gm, name, trace_options, fallback=not strict, cache=cache)
        pieces = [compiled]
    else:
        compiled, pieces = split(gm, refused, name, trace_options, fallback=not strict, cache=cache)
        report.partitions = len(pieces)
    log.info("%s: %d ops compiled in %d piece(s), %d run by PyTorch", name, sum(report.compiled.values()),
             len(pieces), sum(report.fallback.values()))
    if options.get("report") is not None:
        options["report"](report)

    keep = options.get("lowered") if not refused else None

    def run(args: list):
        if keep is not None:
            keep(report, compiled.lower(*args))
        return compiled(*args)
    run._boxed_call = True          # AOTAutograd's convention: the arguments come as one list
    run.pieces = pieces
    run.report = report
    return run


def register() -> None:
    """Make backend="tracecomp" known to torch.compile without the entry point (an
    uninstalled checkout); a no-op where the entry point or an earlier call did it."""
    from torch._dynamo.backends import registry
    compilers = getattr(registry, "_COMPILER_FNS", {})
    found = getattr(registry, "_BACKENDS", {})
    if "tracecomp" in compilers or found.get("tracecomp") is not None:
        return                      # registered, or the entry point will load us on lookup
    registry.register_backend(backend, name="tracecomp")
