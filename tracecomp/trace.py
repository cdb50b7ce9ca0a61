"""tc.trace: record a function into a graph per input signature, optimize it, run it.

The signature of a call is the pytree structure of its arguments, each tensor leaf's
shape and dtype, and the value of every non-tensor leaf (Python scalars are static, as
with torch.compile's specialization, so changing one retraces).  Each new signature is
traced under the Tracer key, optimized by the pass pipeline and cached; retraces are
logged with what changed and warn once past `max_retraces`.
"""
from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable

import numpy as np

from . import pytree
from .errors import ArgumentError, TraceError
from .ir import Graph, TensorType
from .tensor import Tensor, as_tensor
from .tracer import TraceContext

log = logging.getLogger("tracecomp.trace")
if os.environ.get("TRACECOMP_LOG"):
    logging.basicConfig()
    log.setLevel(logging.DEBUG if os.environ["TRACECOMP_LOG"].lower() in ("debug", "2") else logging.INFO)

DEFAULT_MAX_RETRACES = 8
BACKENDS = ("cpu", "interp")


def _is_array_leaf(x: Any) -> bool:
    if isinstance(x, (Tensor, np.ndarray)):
        return True
    if isinstance(x, (bool, int, float, str, type(None), np.generic)):
        return False
    return hasattr(x, "__dlpack__") or hasattr(x, "__array__")


def _describe_leaf(x) -> str:
    return str(x) if isinstance(x, TensorType) else repr(x)


class Lowered:
    """One signature of a traced function: its graphs, its compiled form, its stages as text.
    Scheduling and native compilation happen on first use (first call or first look)."""

    def __init__(self, graph: Graph, optimized: Graph, out_structure, backward_ops: set,
                 backend: str = "cpu"):
        self.graph = graph
        self.optimized = optimized
        self.out_structure = out_structure
        self.backward_ops = backward_ops
        self.backend = backend

    STAGES = ("graph", "backward", "optimized", "loops", "llvm", "asm")

    @functools.cached_property
    def program(self):
        from .lower.schedule import schedule
        return schedule(self.optimized)

    @functools.cached_property
    def compiled(self):
        from .runtime.compiled import CompiledProgram
        return CompiledProgram(self.program)

    @property
    def loops(self) -> str:
        from .lower.loops_printer import print_kernels
        from .lower.source_notes import source_notes
        return print_kernels(self.program.kernels, source_notes(self.program))

    @property
    def llvm(self) -> str:
        from .lower.source_notes import annotate, source_notes
        from .runtime import target
        module = target.optimize(target.parse(str(self.compiled.module)), target.host_target_machine())
        return annotate(str(module), source_notes(self.program), ";")

    @property
    def asm(self) -> str:
        from .lower.source_notes import annotate, source_notes
        from .runtime import target
        tm = target.host_target_machine()
        text = target.emit_assembly(target.optimize(target.parse(str(self.compiled.module)), tm), tm)
        return annotate(text, source_notes(self.program), "#" if tm.triple.startswith(("x86", "i686")) else "//")

    @property
    def backward(self) -> Graph:
        """The ops the autograd engine recorded, cut out as a function of the forward values."""
        from .ir.subgraph import extract
        return extract(self.graph, self.backward_ops, self.graph.name + "_backward")

    def as_text(self, stage: str = "optimized") -> str:
        from .ir.printer import print_graph
        if stage not in self.STAGES:
            raise ArgumentError(f"unknown stage {stage!r}; available: {', '.join(self.STAGES)}")
        value = getattr(self, stage)
        return value if isinstance(value, str) else print_graph(value)

    def run(self, inputs: list[np.ndarray]):
        if self.backend == "interp":
            from .runtime.interpreter import run_graph
            arrays = run_graph(self.optimized, inputs)
        else:
            arrays = self.compiled(inputs)
        return pytree.unflatten(self.out_structure, [Tensor.from_numpy(a) for a in arrays])


class TracedFunction:
    def __init__(self, fn: Callable, backend: str = "cpu", max_retraces: int = DEFAULT_MAX_RETRACES):
        if backend not in BACKENDS:
            raise ArgumentError(f"tc.trace: unknown backend {backend!r} (available: {', '.join(BACKENDS)})")
        self.fn = fn
        self.backend = backend
        self.max_retraces = max_retraces
        self._cache: dict[Any, Lowered] = {}
        self._history: list[Any] = []
        self._warned = False
        functools.update_wrapper(self, fn)

    def _signature(self, args: tuple, kwargs: dict):
        leaves, structure = pytree.flatten((args, kwargs), _is_array_leaf)
        tensors = [as_tensor(x) for x in leaves]
        for t in tensors:
            if t._data is None:
                raise TraceError("tc.trace'd functions take concrete tensors, not traced ones "
                                 "(nested tc.trace inside a traced function is not supported)")
        key = (structure, tuple(t._type for t in tensors))
        return key, structure, tensors

    def lower(self, *args, **kwargs) -> Lowered:
        return self._lookup(args, kwargs)[0]

    def __call__(self, *args, **kwargs):
        lowered, tensors = self._lookup(args, kwargs)     # the signature is computed once per call
        return lowered.run([t._data for t in tensors])

    def _lookup(self, args: tuple, kwargs: dict) -> tuple[Lowered, list[Tensor]]:
        key, structure, tensors = self._signature(args, kwargs)
        if key not in self._cache:
            self._note_retrace(key)
            self._cache[key] = self._trace(structure, tensors)
        return self._cache[key], tensors

    def _trace(self, structure, tensors: list[Tensor]) -> Lowered:
        from .passes import optimize
        graph = Graph(getattr(self.fn, "__name__", "main").replace("<", "").replace(">", "") or "main",
                      [t._type for t in tensors])
        ctx = TraceContext(graph)
        with ctx:
            traced = [ctx.wrap(v) for v in graph.inputs]
            args, kwargs = pytree.unflatten(structure, traced)
            result = self.fn(*args, **kwargs)
            out_leaves, out_structure = pytree.flatten(result, lambda x: isinstance(x, (Tensor, np.ndarray)))
            graph.outputs = [ctx.value_of(as_tensor(t)) for t in out_leaves]
        return Lowered(graph, optimize(graph), out_structure, ctx.backward_ops, self.backend)

    def _note_retrace(self, key) -> None:
        if self._history:
            log.info("retracing %s: %s", self.__name__, _explain_change(self._history[-1], key))
        self._history.append(key)
        if len(self._history) > self.max_retraces and not self._warned:
            self._warned = True
            lines = "\n".join(f"  {i}: {_explain_key(k)}" for i, k in enumerate(self._history))
            warnings.warn(f"tc.trace: {self.__name__} was traced {len(self._history)} times "
                          f"(more than {self.max_retraces}); every new shape, dtype or Python "
                          f"scalar value retraces. Signatures so far:\n{lines}", stacklevel=3)


def _signature_items(key) -> list[tuple[str, str]]:
    structure, types = key
    paths = pytree.leaf_paths(structure[1][0], "args") + pytree.leaf_paths(structure[1][1], "kwargs")
    statics, it = [], iter(types)

    def walk(s):
        if s == pytree.LEAF:
            statics.append(_describe_leaf(next(it)))
            return
        kind, body = s
        if kind == "static":
            statics.append(repr(body))
        elif kind == "dict":
            for _, v in body:
                walk(v)
        else:
            for v in body:
                walk(v)
    walk(structure[1][0])
    walk(structure[1][1])
    return list(zip(paths, statics))


def _explain_key(key) -> str:
    return ", ".join(f"{p}: {d}" for p, d in _signature_items(key))


def _explain_change(old, new) -> str:
    a, b = _signature_items(old), _signature_items(new)
    if [p for p, _ in a] != [p for p, _ in b]:
        return f"argument structure changed from ({_explain_key(old)}) to ({_explain_key(new)})"
    changes = [f"{p} changed from {x} to {y}" for (p, x), (_, y) in zip(a, b) if x != y]
    return "; ".join(changes) or "signature changed"


def trace(fn: Callable | None = None, *, backend: str = "cpu",
          max_retraces: int = DEFAULT_MAX_RETRACES):
    """Compile `fn` on its first call per input signature; usable as @trace or trace(fn)."""
    if fn is None:
        return lambda f: TracedFunction(f, backend, max_retraces)
    return TracedFunction(fn, backend, max_retraces)
