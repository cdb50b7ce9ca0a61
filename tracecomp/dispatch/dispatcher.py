"""The dispatcher: ordered dispatch keys, kernels registered per (key, op), redispatch.

A call computes its key set from the arguments (a traced tensor adds Tracer, a tensor
that requires grad adds Autograd while grad mode is on, a tensor with a tangent ForwardAD,
a batched tensor of tc.vmap Batched) and from thread-local state (an active trace adds
Tracer, an active vmap Batched), then runs the kernel of the highest-priority key that has
one.  Under tc.vmap, only the tensors of the innermost vmap level among the arguments
count for Autograd and ForwardAD: the others are constants at that level, and their own
gradients and tangents are handled when Batched calls the op on the whole batches.  A kernel may handle the call entirely or `redispatch` it to the keys below its own,
as seed 003 describes for PyTorch (Autograd records history, then redispatches to CPU).

A composite op reaches no key: the call runs its program through the public ops, so every
key sees only the ops it decomposes into (PyTorch's CompositeImplicitAutograd), and a trace
records those.  library/composites.py registers that runner (library comes after dispatch).

tc.autocast (autocast.py) acts here too, before any key, as PyTorch's Autocast key: an op
with an `autocast` policy in ops.yaml gets its inputs cast (autocast_policy.py; the casts
are ordinary `to` calls, so autograd and the Tracer see them), then runs with autocast off,
so a composite's program is not cast again inside.
"""
from __future__ import annotations

import enum
import threading
from typing import Any, Callable

from ..core.devices import DeviceBuffer
from ..core.dtypes import DType
from ..core.errors import BackendError
from ..ops.table import OpDef
from ..tensors.results import map_tensors
from ..tensors.tensor import Tensor
from .autocast_policy import cast_arguments


class DispatchKey(enum.IntEnum):
    """Higher priority first. New keys (e.g. CUDA) slot in by value.

    Autograd sits above Tracer (unlike PyTorch's tracer, ours computes no values: traced
    tensors are symbolic, so Tracer acts as their backend); recording autograd history on
    traced tensors is what turns the eager engine into symbolic differentiation.  Batched
    (tc.vmap) sits below the autograd keys, so a gradient taken inside a vmap is one per
    batch item, and above Tracer, so a vmap inside tc.trace records batched ops.
    """
    ForwardAD = 0
    Autograd = 1
    Batched = 2
    Tracer = 3
    CUDA = 4        # a tensor in GPU memory: the op compiled for the device (transforms/eager_cuda.py)
    CPU = 5


Kernel = Callable[[OpDef, dict[str, Any]], Any]


class _State(threading.local):
    def __init__(self):
        self.included: set[DispatchKey] = set()
        self.grad_enabled = True
        self.differentiating = 0      # depth of tc.grad/vjp calls running their function
        self.region = None            # the RegionTrace recording a loop body (tracer.py), or None
        self.autocast: DType | None = None   # tc.autocast's dtype while it is on


state = _State()


def tensor_arguments(args: dict[str, Any]) -> list:
    """The Tensors among an op's arguments (also inside a Tensor[])."""
    return [t for v in args.values() for t in (v if isinstance(v, (list, tuple)) else (v,))
            if isinstance(t, Tensor)]


def level_of(t) -> int:
    """The tc.vmap level a tensor belongs to (batching.py): 0 for a plain tensor."""
    return t._batch[1] if t._batch is not None else 0


def _no_composite_runner(op: OpDef, args: dict[str, Any]) -> Any:
    raise BackendError(f"{op.full_name}: composite ops run once library/composites.py registered "
                       "its runner (import tracecomp)")


class Dispatcher:
    def __init__(self):
        self._kernels: dict[DispatchKey, dict[str, Kernel]] = {k: {} for k in DispatchKey}
        self._fallbacks: dict[DispatchKey, Kernel] = {}
        self._composite: Kernel = _no_composite_runner

    def register_composite(self, runner: Kernel) -> None:
        """How every composite op runs, whatever the keys: `runner(op, args)`."""
        self._composite = runner

    def register(self, key: DispatchKey, op: OpDef, kernel: Kernel) -> None:
        self._kernels[key][op.full_name] = kernel

    def register_fallback(self, key: DispatchKey, kernel: Kernel) -> None:
        """A kernel for every op of `key` that has none of its own."""
        self._fallbacks[key] = kernel

    def lookup(self, key: DispatchKey, op: OpDef) -> Kernel | None:
        return self._kernels[key].get(op.full_name) or self._fallbacks.get(key)

    def keys_for(self, args: dict[str, Any]) -> list[DispatchKey]:
        keys = set(state.included) | {DispatchKey.CPU}
        tensors = tensor_arguments(args)
        top = max(map(level_of, tensors), default=0)
        for t in tensors:
            if t._value is not None:
                keys.add(DispatchKey.Tracer)
            elif isinstance(t._data, DeviceBuffer):
                keys.add(DispatchKey.CUDA)
            if t._batch is not None:
                keys.add(DispatchKey.Batched)
            if level_of(t) != top:
                continue
            if t.requires_grad and state.grad_enabled:
                keys.add(DispatchKey.Autograd)
            if t._tangent is not None:
                keys.add(DispatchKey.ForwardAD)
        return sorted(keys)

    def call(self, op: OpDef, args: dict[str, Any]) -> Any:
        if state.region is not None:
            # a loop body sees tensors from outside it as its own block arguments (captures),
            # so no key of theirs (grad, tangent, batch) acts inside the body
            args = map_tensors(args, state.region.local)
        if state.autocast is not None and op.autocast:
            return self._autocast(op, args)
        if op.kind == "composite":
            return self._composite(op, args)
        return self._run(op, args, self.keys_for(args))

    def _autocast(self, op: OpDef, args: dict[str, Any]) -> Any:
        low, state.autocast = state.autocast, None
        try:
            return self.call(op, cast_arguments(op, args, low, Tensor.to))
        finally:
            state.autocast = low

    def redispatch(self, op: OpDef, args: dict[str, Any], below: DispatchKey) -> Any:
        """Run the call again with only the keys of lower priority than `below`."""
        return self._run(op, args, [k for k in self.keys_for(args) if k > below])

    def _run(self, op: OpDef, args: dict[str, Any], keys: list[DispatchKey]) -> Any:
        for key in keys:
            kernel = self.lookup(key, op)
            if kernel is not None:
                return kernel(op, args)
        raise BackendError(f"{op.full_name}: no kernel for dispatch keys {[k.name for k in keys]}")


dispatcher = Dispatcher()
