"""The Tracer dispatch key: records each op call into the graph of the active trace.

While a TraceContext is active, every op call (also on eager tensors and factories)
reaches the Tracer kernel, which turns Tensor arguments into SSA values, the other
arguments into typed attributes, infers result
types with the table's shape rules, and appends one op with the user's source location.
A composite op never gets here: the dispatcher runs its program, so the trace records the
ops it decomposes into, each located at the composite's call and naming it as its source
(library/composites.py), and an argument it changes in place (batch_norm's running
statistics) is changed on the traced tensor, which tc.trace writes back.

An eager tensor that an op meets becomes a hidden graph input when the traced function
closes over it (the context's `closure`, closures.py: read again at every call), and a
`tc.constant` op otherwise (made inside the function, a wrapped NumPy array, or a trace
for export, which has no closure).  A closed-over tensor changed in place inside the
function is put back as it was when the function returns (`restore_lifted`); its new
value is an output that tc.trace writes back at every call.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import batching
from .dispatcher import DispatchKey, state
from ..core.errors import TraceError
from ..ir import CONSTANT, Graph, Value
from ..core.locations import BACKWARD, Location, user_location
from ..core.symbolic import DynamicShapeError
from ..ops import rules
from ..ops.table import OpDef
from ..tensors.results import package, type_args
from ..tensors.tensor import Tensor, restore, snapshot

UNKNOWN_LOCATION = Location("<unknown>", 0)   # carries the phase of an op no frame explains


class TraceContext:
    """One graph being recorded; pushed on a thread-local stack while the user's fn runs."""

    def __init__(self, graph: Graph, closure=None):
        self.graph = graph
        self.location_override: Location | None = None
        self.backward_depth = 0            # > 0 while the autograd engine runs
        self._constants: dict[int, tuple[Any, Value]] = {}
        self.closure = closure             # transforms/closures.py's Closure of the traced function, or None
        self.lifted: list[Lifted] = []     # hidden inputs, in order, after the arguments
        self.baked_arrays: list[tuple[str, Any]] = []   # (name, array) of closed-over NumPy constants

    def record(self, name: str, operands: list, attrs: dict, types: list, regions=()):
        loc = self.location()
        if self.backward_depth:                # every op the engine records is backward
            loc = (loc or UNKNOWN_LOCATION).derived(BACKWARD)
        return self.graph.add_op(name, operands, attrs, types, loc, regions)

    @property
    def backward_ops(self) -> set:
        """The ops of the backward pass: the engine's, and the seed gradients."""
        return {op for op in self.graph.ops if op.loc is not None and op.loc.is_backward}

    def location(self) -> Location | None:
        return self.location_override or user_location()

    @contextlib.contextmanager
    def located(self, loc: Location | None):
        """Ops recorded inside get `loc` (None: the user's frame, as outside)."""
        old, self.location_override = self.location_override, loc
        try:
            yield
        finally:
            self.location_override = old

    def value_of(self, t) -> Value:
        if t._value is not None:
            if t._trace is not self:
                raise TraceError("a traced tensor was used outside the trace that created it "
                                 "(did it escape a tc.trace'd function through a global or closure?)")
            return t._value
        key = id(t)
        if key not in self._constants:
            self._constants[key] = (t, self._capture(t))    # keep t alive so its id stays unique
        return self._constants[key][1]

    def _capture(self, t) -> Value:
        """An eager tensor's first use: a hidden input if the function closes over it, else a
        constant (noting a closed-over NumPy array it wraps)."""
        source = self.closure.source_of(t) if self.closure is not None else None
        if source is not None:
            value = self.graph.add_input(t._type)
            self.lifted.append(Lifted(t, source, value, snapshot(t)))
            return value
        if self.closure is not None:
            name = self.closure.baked_array(t)
            if name is not None:
                self.baked_arrays.append((name, t._data))
        return self.record(CONSTANT, [], {"value": np.array(t._data)}, [t._type]).result

    def changed_lifted(self) -> list[int]:
        """Positions (among `lifted`) of the closed-over tensors changed in place so far."""
        return [i for i, h in enumerate(self.lifted) if h.tensor._version != h.state[-1]]

    def restore_lifted(self) -> None:
        """Give every closed-over tensor back its eager state: the trace only recorded the
        change (tc.trace makes it at each call)."""
        for h in self.lifted:
            restore(h.tensor, h.state)

    def wrap(self, value: Value):
        return Tensor(None, value.type, value, self)

    def __enter__(self):
        _stack.contexts.append(self)
        state.included.add(DispatchKey.Tracer)
        return self

    def __exit__(self, *exc):
        _stack.contexts.pop()
        if not _stack.contexts:
            state.included.discard(DispatchKey.Tracer)


@dataclass
class Lifted:
    """A closed-over tensor made a hidden input: where it lives, its graph input, and its
    eager state when first met."""
    tensor: Any
    source: Any          # transforms/closures.py's Source
    value: Value
    state: tuple         # tensor.snapshot (its version last)


class _Stack(threading.local):
    def __init__(self):
        self.contexts: list[TraceContext] = []


_stack = _Stack()


def current() -> TraceContext | None:
    return _stack.contexts[-1] if _stack.contexts else None


def operands_and_attrs(op: OpDef, args: dict[str, Any], value_of) -> tuple[list, dict]:
    """Split an op's arguments into SSA operands (Tensors) and attributes (everything else).

    Every argument is kept: a Tensor argument given as a Python scalar, or a Tensor? given
    as None, becomes an attribute, so the op's text names all of its arguments.
    """
    operands, attrs = [], {}
    for a in op.schema.arguments:
        if a.binding_only:
            continue
        v = args[a.name]
        if isinstance(v, Tensor):
            operands.append(value_of(v))
        elif a.type.is_tensor_list:
            operands.extend(value_of(t) for t in v if t is not None)
            if a.type.elem_optional:        # Tensor?[]: which entries are tensors
                attrs[a.name] = tuple(int(t is not None) for t in v)
        else:
            attrs[a.name] = v
    return operands, attrs


def trace_kernel(op: OpDef, args: dict[str, Any]):
    ctx = current()
    if ctx is None:
        raise TraceError(f"{op.full_name}: a traced tensor was used after its trace finished")
    try:
        out_types = rules.infer(op, type_args(args))
    except DynamicShapeError as e:
        raise DynamicShapeError(f"{op.full_name}: {e.reason}") from None
    operands, attrs = operands_and_attrs(op, args, ctx.value_of)
    recorded = ctx.record(op.ir_name, operands, attrs, out_types)
    return package(op, [ctx.wrap(v) for v in recorded.results])


class RegionTrace(TraceContext):
    """Records a loop body or branch (a region: ir/regions.py) into a graph of its own.

    Regions are isolated from above: a tensor from outside that the function uses (a traced
    value of the enclosing graph, a closed-over or constant eager tensor, a batched or
    differentiated one) becomes a block argument, and the tensor itself one of `captured`,
    which the op then takes as operands.  The dispatcher swaps such tensors for their block
    arguments before any key looks at them (`local`), so inside the body they are plain
    traced values: their gradients, tangents and batches are the region op's business
    (control/), not the body's.  Keys active outside (an enclosing tc.vmap) are hidden while
    the body records.
    """

    def __init__(self, graph: Graph):
        super().__init__(graph)
        self.captured: list = []                  # outer tensors, in block-argument order
        self._states: list[tuple] = []            # each one's state when captured (snapshot)
        self._locals: dict[int, Tensor] = {}      # id(outer tensor) -> its block argument
        self._saved = None

    def owns(self, t: Tensor) -> bool:
        """Whether `t` was made inside this region (a tc.vmap inside it wraps such values)."""
        while t._batch is not None and t._trace is None:
            t = t._batch[0]
        return t._trace is self

    def local(self, t: Tensor) -> Tensor:
        if self.owns(t):
            return t
        found = self._locals.get(id(t))
        if found is None:
            found = self.wrap(self.graph.add_input(t._type))
            self._locals[id(t)] = found
            self.captured.append(t)               # also keeps t alive, so its id stays unique
            self._states.append(snapshot(t))
        return found

    def changed_captures(self) -> list:
        """The outer tensors the body changed in place, each put back as it was: a region
        cannot write outside itself (the change would happen once, not once per step)."""
        changed = [t for t, state in zip(self.captured, self._states) if t._version != state[-1]]
        for t, state in zip(self.captured, self._states):
            restore(t, state)
        return changed

    def value_of(self, t) -> Value:
        return self.local(t)._value

    def __enter__(self):
        self._saved = (state.region, set(state.included), batching.hide_frames())
        super().__enter__()
        state.region = self
        state.included.clear()
        state.included.add(DispatchKey.Tracer)
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        state.region, included, frames = self._saved
        state.included.clear()
        state.included.update(included)
        batching.show_frames(frames)
