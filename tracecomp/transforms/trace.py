"""tc.trace: record a function into a graph per input signature, optimize it, run it.

The signature of a call is the pytree structure of its arguments, each tensor leaf's
shape and dtype, and the value of every non-tensor leaf (Python scalars are static, as
with torch.compile's specialization, so changing one retraces; NumPy scalars are 0-d
tensors, as in JAX).  Each new signature is
traced under the Tracer key, optimized by the pass pipeline and cached; retraces are
logged with what changed and warn once past `max_retraces`.

Calls whose arguments are all NumPy arrays, concrete Tensors or whole tc.nn models (no
kwargs) first look up a cheaper key, each argument's shape and dtype and a model's remembered
structure with its leaves' types (`_fast_signature`), filled after the full lookup found the
signature and took every argument as it was.  Each signature is a `Lowered`
(stages.py), which records the time of every compile stage (timings.py; `Lowered.timings`),
logged when TRACECOMP_LOG is set.

Dynamic dims (`dynamic=`, torch.compile's rule by default): the signatures that differ only
in sizes (same structure, Python values, dtypes and ranks) form a group, which remembers
each dim's one size, or that it changed.  A call that no compile serves traces with the
dims that changed (or those `dynamic` names) as symbolic sizes (symbolic.Dim; equal sizes
share one, as PyTorch's duck sizing), so the second size of a growing sequence compiles
one program that every later size runs (runtime/compiled.py DynamicProgram).  A size of 0
or 1 stays static (its own compile).  A dynamic compile serves a call whose shapes meet
its size equations (entry_sizes.ShapeEquations, every size >= 2) and where its guards
still hold: the `==` that answered False during its trace, and the order comparisons
(`seq > 4`) answered at that call's sizes (symbolic.recording_guards).  Where the trace or
compile with symbolic sizes fails (a DynamicShapeError: the function reads a size as a
number), that group compiles each shape, and the log says why, once.  Where it failed on a
size that tracecomp's own code needed as a number (attention's head dim, a LayerNorm's
normalized size: symbolic.recording_fixed_wanted), that size is fixed to this call's and
the trace is tried again with the others dynamic, as PyTorch specializes such a size.
"""
from __future__ import annotations

import collections
import functools
import itertools
import logging
import operator
import time
import uuid
import warnings
from typing import Any, Callable

import numpy as np

from . import closures, staging
from ..library import unbacked
from ..tensors import pytree
from ..tensors.pytree import fast_flatten
from ..autograd.grad_mode import is_differentiating, is_grad_enabled
from ..dispatch.autocast import autocast_key
from ..core import timings
from .pickling import portable, rebuild as _rebuild, source_files
from .stages import Lowered, describe_leaf
from ..core.dtypes import from_numpy
from ..core.devices import Device, DeviceBuffer
from ..core.errors import ArgumentError, TraceError
from ..ir import Graph, TensorType
from ..core.symbolic import (Dim, DynamicShapeError, answering_at, guards_hold, recording_fixed_wanted,
                              recording_guards, sizes_to_fix)
from ..tensors.tensor import Tensor, as_tensor
from ..dispatch.tracer import TraceContext
from ..core.locations import user_stacklevel
from ..runtime.cuda.memory import available as cuda_available

log = logging.getLogger("tracecomp.transforms.trace")

DEFAULT_MAX_RETRACES = 8
DEFAULT_CACHE_SIZE = 64      # compiled signatures kept per traced function (least recently used go)
# A dynamic dim's hint (symbolic.hint: the size the scheduler's heuristics plan for, such as
# a packed matmul) is its size at the call that compiles it or this, the larger: a size that
# varies is compiled for the larger sizes it will see (a decode compiles at length 2).
DYNAMIC_HINT = 64
BACKENDS = ("cpu", "interp")
DEVICES = ("cpu", "cuda")


def _is_array_leaf(x: Any) -> bool:
    """Tensors, arrays and NumPy scalars (np.float32(0.1): data, as in JAX, so an Adam step
    whose bias correction changes every call compiles once) are traced; Python numbers,
    strings and None are static, as in torch.compile: a new value retraces."""
    if isinstance(x, (Tensor, np.ndarray, np.generic)):
        return not isinstance(x, (np.str_, np.bytes_, np.void))
    if isinstance(x, (bool, int, float, str, type(None))):
        return False
    return hasattr(x, "__dlpack__") or hasattr(x, "__array__")


def _leaf_key(t: Tensor):
    """A concrete tensor's part of a fast key: its type, and whether it is in GPU memory."""
    return t._type if type(t._data) is np.ndarray else (t._type, "cuda")


def _fast_signature(args: tuple) -> tuple[tuple, list, list] | None:
    """(signature key, leaves, their arrays) for calls whose arguments are NumPy arrays,
    concrete Tensors or trees with a remembered flattening (a whole tc.nn model:
    pytree.fast_flatten), None otherwise: cheaper than flattening the arguments and building
    Tensors."""
    key, leaves, arrays = [], [], []
    differentiating = None
    for a in args:
        t = type(a)
        if t is np.ndarray:
            key.append((a.shape, a.dtype))
            leaves.append(a)
            arrays.append(a)
        elif t is Tensor and a._data is not None and not a.requires_grad and a._tangent is None:
            key.append(_leaf_key(a))     # (a tensor autograd tracks takes the full path: _is_transformed)
            leaves.append(a)
            arrays.append(a._data)
        else:
            flat = fast_flatten(a, _is_array_leaf)
            if flat is None:
                return None
            structure, tree_leaves, scratch = flat
            if differentiating is None:
                differentiating = is_grad_enabled() and is_differentiating()
            seen = None if differentiating else _remembered_tree(tree_leaves, scratch)
            if seen is None:
                entry = _tree_entry(structure, tree_leaves, differentiating)
                if entry is None:
                    return None
                seen = (tuple(map(_DATA, tree_leaves)), list(map(_VERSION, tree_leaves)), entry)
                if not differentiating:
                    scratch["trace"] = seen
            key.append(seen[2])
            leaves += tree_leaves
            arrays += seen[0]
    return (*key, autocast_key()), leaves, arrays


_DATA, _VERSION = operator.attrgetter("_data"), operator.attrgetter("_version")


def _tree_entry(structure, leaves: list[Tensor], differentiating: bool) -> "_TreeKey | None":
    """A whole model's part of a fast key, or None where a transform sees its tensors."""
    types = []
    for x in leaves:      # a model's parameters: data, unless a transform sees them
        if x._batch is not None or _seen_by_a_transform(x, differentiating):
            return None
        types.append(_leaf_key(x))
    return _TreeKey(("tree", structure, tuple(types)))


def _seen_by_a_transform(x: Tensor, differentiating: bool) -> bool:
    """Whether a transform around the call sees tensor x: an outer tc.trace (no data),
    forward-mode autodiff (a tangent), or autograd (history, or requiring grad while
    tc.grad/vjp runs: `differentiating`).  A model's parameters, which require grad as
    leaves outside any of those, are data like any other tensor."""
    return x._data is None or x._tangent is not None or x.grad_fn is not None or \
        (x.requires_grad and differentiating)


def _remembered_tree(leaves: list[Tensor], scratch: dict) -> tuple | None:
    """(the arrays, versions and key part) of the model's tensors at its last call, if every
    tensor still holds the array it had then, unchanged in place (its version): their types,
    device and flags are as they were (only in-place changes and rebinding the array change
    them), so the per-leaf checks are skipped.  Two passes at C speed instead of a Python
    loop over the parameters."""
    seen = scratch.get("trace")
    if seen is not None and all(map(operator.is_, map(_DATA, leaves), seen[0])) \
            and list(map(_VERSION, leaves)) == seen[1]:
        return seen
    return None


class _TreeKey:
    """A model's part of a fast key, hashed once: a tuple would hash every leaf's type at each
    lookup (tuples do not keep their hash)."""
    __slots__ = ("entry", "_hash")

    def __init__(self, entry: tuple):
        self.entry, self._hash = entry, hash(entry)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (type(other) is _TreeKey and self._hash == other._hash and self.entry == other.entry)


def _check_donate_argnums(donate_argnums) -> tuple[int, ...]:
    nums = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    for i in nums:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ArgumentError(f"tc.trace: donate_argnums must be non-negative argument positions, got {i!r}")
    return nums


class _TimedTraceContext(TraceContext):
    """A TraceContext that also times the autograd engine: the engine raises backward_depth
    while it runs, and that time moves from the "trace" stage to "autodiff"."""
    _depth = 0
    _since = 0.0

    @property
    def backward_depth(self) -> int:
        return self._depth

    @backward_depth.setter
    def backward_depth(self, depth: int) -> None:
        if self._depth == 0 and depth > 0:
            self._since = time.perf_counter()
        elif self._depth > 0 and depth == 0:
            timings.add("autodiff", time.perf_counter() - self._since)
        self._depth = depth


class _Dynamic(collections.namedtuple("_Dynamic", "group equations guards lowered")):
    """A compile with dynamic dims and what it serves: calls of its `group` (_group) whose
    argument shapes meet `equations` with every size >= 2 and where `guards` hold."""

    def sizes(self, group, types: list[TensorType]) -> dict[str, int] | None:
        """The sizes of a call of these types, where they meet the equations; else None."""
        if group != self.group:
            return None
        try:
            return self.equations.bind([t.shape for t in types], least=2)
        except ArgumentError:
            return None

    def serves(self, group, types: list[TensorType]) -> bool:
        sizes = self.sizes(group, types)
        return sizes is not None and guards_hold(self.guards, sizes)


def _group(key) -> tuple:
    """A signature without its sizes: the signatures that one compile with dynamic dims may serve."""
    structure, types = key
    return structure, tuple((t.dtype, len(t.shape)) for t in types)


class TracedFunction:
    def __init__(self, fn: Callable, backend: str = "cpu", max_retraces: int = DEFAULT_MAX_RETRACES,
                 device: str = "cpu", donate_argnums: int | tuple[int, ...] = (), fastmath=False,
                 cache_size: int = DEFAULT_CACHE_SIZE, check_indices: bool = True, dynamic=None):
        from ..lower.llvm.codegen import fastmath_flags
        if backend not in BACKENDS:
            raise ArgumentError(f"tc.trace: unknown backend {backend!r} (available: {', '.join(BACKENDS)})")
        if device not in DEVICES:
            try:
                device = Device(device).type          # "cuda:0", tc.device("cuda"), a torch.device
            except ArgumentError:
                raise ArgumentError(f"tc.trace: unknown device {device!r} (available: {', '.join(DEVICES)})") from None
        if device == "cuda" and backend == "interp":
            raise ArgumentError("tc.trace: backend='interp' runs on the host; it cannot take device='cuda'")
        self.fn = fn
        self.backend = backend
        self.device = device
        self.donate_argnums = _check_donate_argnums(donate_argnums)
        self.fastmath = fastmath_flags(fastmath)
        # _fast_signature's key -> (Lowered, its runner for the arguments' owned arrays)
        self._fast: dict[tuple, tuple[Lowered, Callable]] = {}
        self.max_retraces = max_retraces
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ArgumentError(f"tc.trace: cache_size must be a positive int, got {cache_size!r}")
        self.cache_size = cache_size
        self._cache: collections.OrderedDict[Any, Lowered] = collections.OrderedDict()   # LRU order
        self._history: list[Any] = []
        self._warned = False
        self._mapped: dict[tuple, TracedFunction] = {}    # in tc.vmap: the mapped function, per axes
        self.check_indices = bool(check_indices)
        if not (dynamic is None or isinstance(dynamic, (bool, dict))):
            raise ArgumentError(f"tc.trace: dynamic must be None, True, False or a dict like "
                                f"{{'x': {{0: 'batch'}}}}, got {dynamic!r}")
        if dynamic not in (None, False) and backend != "cpu":
            raise ArgumentError("tc.trace: dynamic dims run on the CPU backend (backend='cpu', on the host "
                                "or with device='cuda'); "
                                f"this function has backend={backend!r}")
        # on CUDA only where asked for: by default each shape keeps its static kernels there
        self.dynamic = dynamic if backend == "cpu" and (device == "cpu" or dynamic) else False
        if isinstance(dynamic, dict):
            _dynamic_leaves(fn, None, dynamic)         # a bad spec fails now, not at the first call
        self._sizes_seen: dict[tuple, list[list]] = {}  # per group: each dim's size, None once it changed
        self._dynamic: list[_Dynamic] = []             # the compiles with dynamic dims, newest first
        self._static_only: set[tuple] = set()          # groups whose dims cannot be dynamic (logged once)
        self._options = (backend, max_retraces, device, donate_argnums, fastmath, cache_size, self.check_indices,
                         dynamic)
        self._identity = uuid.uuid4().hex      # the same across pickles (pickling.rebuild)
        self._warned_arrays: set[str] = set()  # closed-over NumPy arrays warned about
        functools.update_wrapper(self, fn)

    def __reduce__(self):
        """Pickled (plain pickle, or cloudpickle as Dask uses) without native code: the
        function, the options and the signatures traced so far.  The copy compiles on its
        first call per signature, which is a compile-cache load wherever a cache folder holds
        the code (a folder shared by a cluster's workers: one compile serves all).  A copy that
        arrives again carrying other state (a changed global) replaces the earlier one
        (pickling.rebuild)."""
        return _rebuild, (TracedFunction, portable(self.fn), self._options, self.signatures, self._identity,
                          source_files(self.fn))

    @property
    def signatures(self) -> list:
        """The signatures traced so far, oldest first: (argument structure, input types)."""
        return list(self._history)

    def eval_shape(self, *args, **kwargs):
        """The outputs' shapes and dtypes (a pytree of `ShapeDtype`) for arguments that need only
        have `.shape` and `.dtype` (arrays, tensors, Dask arrays, ShapeDtype): a trace at that
        signature, no compile and no data (JAX's eval_shape)."""
        leaves, structure = pytree.flatten((args, kwargs), _is_shaped_leaf)
        types = [_spec_type(x) for x in leaves]
        lowered = self._trace(structure, [], types)
        outputs = [ShapeDtype(tuple(t.shape), t.dtype.np) for t in lowered.result_types]
        return pytree.unflatten(lowered.out_structure, outputs)

    def _signature(self, args: tuple, kwargs: dict, flat: tuple | None = None):
        """(cache key, structure, tensors, leaves) of a call; `flat` is (args, kwargs) already
        flattened by the caller."""
        leaves, structure = flat or pytree.flatten((args, kwargs), _is_array_leaf)
        tensors = [as_tensor(x) for x in leaves]
        for t in tensors:
            if t._data is None:
                raise TraceError("tc.trace'd functions take concrete tensors, not traced ones "
                                 "(nested tc.trace inside a traced function is not supported)")
            if self.device == "cpu" and isinstance(t._data, DeviceBuffer):
                raise ArgumentError(f"tc.trace({self.__name__}) runs on the cpu, but it was given a "
                                    f"{t.dtype.label}{list(t.shape)} tensor on {t.device}: trace it with "
                                    "device='cuda', or pass x.cpu()")
        key = ((pytree.cache_key(structure), autocast_key()), tuple(t._type for t in tensors))   # (tc.autocast changes the program)
        return key, structure, tensors, leaves

    def lower(self, *args, **kwargs) -> Lowered:
        return self._lookup(args, kwargs)[0]

    def lower_baked(self, *args, **kwargs) -> Lowered:
        """The signature of `args` with every closed-over tensor baked in as a constant, at
        its value now (what tc.export writes: a library has no Python to read it from):
        the cached signature where the function closes over none, else a fresh trace."""
        lowered = self._lookup(args, kwargs)[0]
        if lowered.hidden is None and not lowered.dynamic:
            return lowered
        _, structure, tensors, _ = self._signature(args, kwargs)
        return self._trace(structure, tensors, bake=True)

    def lower_dynamic(self, args: tuple, dynamic: dict) -> Lowered:
        """A fresh trace at `args` with some dims symbolic (symbolic.py), for export:
        `dynamic` maps an argument (position or parameter name) to {axis: size name}.
        Closed-over tensors are baked in as constants (lower_baked)."""
        _, structure, tensors, _ = self._signature(args, {})
        types = [t._type for t in tensors]
        for leaf, axes in _dynamic_leaves(self.fn, args, dynamic, examples=True).items():
            shape = list(types[leaf].shape)
            for axis, name in axes.items():
                shape[axis] = Dim.named(name, shape[axis])
            types[leaf] = TensorType(tuple(shape), types[leaf].dtype)
        return self._trace(structure, tensors, types, bake=True)

    def __call__(self, *args, **kwargs):
        fast = None if kwargs else _fast_signature(args)
        hit = self._fast.get(fast[0]) if fast is not None else None
        lowered = None
        try:
            if hit is not None:
                lowered, run = hit
                self._cache.move_to_end(lowered.cache_key)       # recently used (LRU order)
                return run(fast[2], fast[1])
            flat = pytree.flatten((args, kwargs), _is_array_leaf)
            if self._is_transformed(flat[0]):
                return self._call_through(args, kwargs)
            lowered, tensors, leaves = self._lookup(args, kwargs, flat)     # the signature is computed once per call
            if fast is not None and len(fast[1]) == len(leaves) and all(
                    x is y and (type(x) is not np.ndarray or t._data is x) for x, y, t in zip(fast[1], leaves, tensors)):
                if len(self._fast) >= 4 * self.cache_size:     # (one per size a dynamic compile served)
                    del self._fast[next(iter(self._fast))]
                # every argument reached the program as it was; which arrays Tensors own
                self._fast[fast[0]] = (lowered, lowered.runner(tuple(type(x) is not np.ndarray for x in leaves)))
            return lowered.run([t._data for t in tensors], leaves)
        except closures.ClosureMoved as moved:
            return self._trace_again(lowered, moved, args, kwargs)

    def _trace_again(self, lowered: Lowered, moved: closures.ClosureMoved, args: tuple, kwargs: dict):
        """The call after a closed-over tensor of `lowered` was replaced by one of another
        shape or dtype, or can no longer be reached: that signature is traced again (after
        every other compile that served it and closes over the same tensor: a dynamic one is
        dropped too).  A second miss right after a fresh trace means the function moves its
        own closure."""
        why = lowered.hidden.explain(moved)
        log.info("retracing %s: %s", self.__name__, why)
        while True:
            if lowered.cache_key in self._cache:
                self._evict(lowered.cache_key)
            cached = {id(v) for v in self._cache.values()}
            lowered, tensors, leaves = self._lookup(args, kwargs)
            try:
                return lowered.run([t._data for t in tensors], leaves)
            except closures.ClosureMoved as again:
                if id(lowered) in cached:
                    continue                  # an older compile that closes over it: dropped in turn
                raise TraceError(f"tc.trace({self.__name__}): {lowered.hidden.explain(again)} right after "
                                 f"it was traced (does the function rebind the tensors it closes over?)") from None

    @staticmethod
    def _is_transformed(leaves: list) -> bool:
        """Whether a transform around this call sees its tensors (_seen_by_a_transform; in
        tc.vmap the mapped tensors hold no data)."""
        differentiating = is_grad_enabled() and is_differentiating()
        return any(isinstance(x, Tensor) and _seen_by_a_transform(x, differentiating) for x in leaves)

    def _call_through(self, args: tuple, kwargs: dict):
        """A call that a transform around it must see.  Inside tc.vmap, the mapped function is
        compiled (one signature per batch size, as any other) and called on the whole batches;
        otherwise, and where autograd must see the ops, fn runs inline: an outer trace records
        its ops into its own graph (as JAX inlines a nested jit), tc.grad differentiates them."""
        from ..dispatch.batching import wrap
        from ..dispatch.dispatcher import level_of
        from .vmap import is_array
        leaves, structure = pytree.flatten((args, kwargs), is_array)
        levels = [level_of(x) if isinstance(x, Tensor) else 0 for x in leaves]
        level = max(levels, default=0)
        here = [level and v == level for v in levels]      # the innermost vmap's tensors
        if not level or any(t.requires_grad or t._tangent is not None or t._batch[0]._value is not None
                            for t, h in zip(leaves, here) if h):
            return self.fn(*args, **kwargs)
        axes = tuple(0 if h and x._batch[2] else None for x, h in zip(leaves, here))
        mapped = self._mapped.get(axes)
        if mapped is None:
            mapped = self._mapped[axes] = self._variant(axes)
        inner_args, inner_kwargs = pytree.unflatten(
            structure, [x._batch[0] if h else x for x, h in zip(leaves, here)])
        out_leaves, out_structure = pytree.flatten(mapped(*inner_args, **inner_kwargs),
                                                   lambda x: isinstance(x, Tensor))
        return pytree.unflatten(out_structure, [wrap(t, level) for t in out_leaves])

    def _variant(self, axes: tuple) -> "TracedFunction":
        """This function mapped over `axes` (one per array leaf of the arguments), traced."""
        from .vmap import call_mapped
        fn = self.fn

        def mapped(*args, **kwargs):
            return call_mapped(fn, args, kwargs, list(axes), 0)
        mapped.__name__ = f"vmap_{getattr(fn, '__name__', 'fn')}"
        return TracedFunction(mapped, self.backend, self.max_retraces, self.device, (), self.fastmath,
                              self.cache_size)

    def _lookup(self, args: tuple, kwargs: dict, flat: tuple | None = None) -> tuple[Lowered, list[Tensor], list]:
        key, structure, tensors, leaves = self._signature(args, kwargs, flat)
        lowered = self._cache.get(key)
        if lowered is None:
            group = _group(key)
            lowered = next((d.lowered for d in self._dynamic if d.serves(group, key[1])), None)
        if lowered is not None:
            self._cache.move_to_end(lowered.cache_key)
            return lowered, tensors, leaves
        lowered = self._compile(key, structure, tensors, args, kwargs)
        while len(self._cache) > self.cache_size:
            self._evict(next(iter(self._cache)))
        return lowered, tensors, leaves

    def _evict(self, key) -> None:
        """Drop the least recently used signature; its native code goes with its last user."""
        gone = self._cache.pop(key)
        for fast in [k for k, (v, _) in self._fast.items() if v is gone]:
            del self._fast[fast]
        self._dynamic = [d for d in self._dynamic if d.lowered is not gone]

    def _compile(self, key, structure, tensors: list[Tensor], args: tuple, kwargs: dict) -> Lowered:
        """A new signature's Lowered, cached: with dynamic dims where the group's sizes changed
        or `dynamic` names them (the module docstring; cached under its signature with the
        symbolic sizes), else specialized to its shapes."""
        from ..lower.llvm.entry_sizes import ShapeEquations      # (llvmlite: not at import time)
        group, types = _group(key), list(key[1])
        labels = _leaf_labels(self.fn, structure)
        changed = self._note_sizes(group, types)
        dims = self._dynamic_dims(group, types, labels, args, kwargs)
        if any(d.sizes(group, types) is not None for d in self._dynamic):
            dims = {}                # a compile with these dims exists; its guards exclude this call
        if dims:
            why = "; ".join(f"{labels[leaf]} axis {axis} " + (
                f"became dynamic ({name}): {changed[leaf, axis][0]} then {changed[leaf, axis][1]}"
                if (leaf, axis) in changed else f"is dynamic ({name})") for (leaf, axis), name in dims.items())
            if self._history:
                log.info("retracing %s: %s", self.__name__, why)
            lowered = None
            while dims:
                dynamic_types = _with_dims(types, dims)
                dynamic_key = (key[0], tuple(dynamic_types))
                sizes = {n: types[leaf].shape[axis] for (leaf, axis), n in dims.items()}
                try:
                    with recording_guards() as guards, recording_fixed_wanted() as wanted:
                        with answering_at(sizes):
                            lowered = self._trace(structure, tensors, dynamic_types, key=dynamic_key)
                        # compiled now: a failure falls back to this shape alone (the PTX alone
                        # where no GPU is here: a dump needs none)
                        lowered.gpu_module if self.device == "cuda" and not cuda_available() else lowered.compiled
                    break
                except Exception as e:
                    lowered = None
                    if isinstance(self.dynamic, dict):
                        if isinstance(e, DynamicShapeError):
                            raise DynamicShapeError(f"tc.trace({self.__name__}): the dynamic sizes {self.dynamic} "
                                                    f"cannot flow through this function: {e.reason}") from e
                        raise
                    names = sizes_to_fix(wanted, sizes)
                    fixed = {d: n for d, n in dims.items() if n in names}
                    if fixed:       # tracecomp needed these sizes as numbers: they stay static, the others dynamic
                        log.info("tc.trace(%s): %s stay static (%s: %s)", self.__name__,
                                 ", ".join(f"{labels[leaf]} axis {axis}" for leaf, axis in fixed),
                                 type(e).__name__, getattr(e, "reason", e))
                        dims = {d: n for d, n in dims.items() if d not in fixed}
                        continue
                    log.info("tc.trace(%s): compiling each shape: %s, but tracing with dynamic sizes failed: "
                             "%s: %s", self.__name__, why, type(e).__name__, getattr(e, "reason", e))
                    break
            if lowered is None:
                self._static_only.add(group)
            else:
                self._note_retrace((structure, tuple(dynamic_types)), logged=True)
                equations = ShapeEquations([t.shape for t in dynamic_types], labels)
                self._dynamic.insert(0, _Dynamic(group, equations, list(guards.values()), lowered))
                self._cache[dynamic_key] = lowered
                if self._dynamic[0].serves(group, types):
                    return lowered
                # (the function compared a size with a number that is this call's size: it serves others)
        self._note_retrace((structure, key[1]))
        lowered = self._cache[key] = self._trace(structure, tensors, donated=self._donated_leaves(args), key=key)
        return lowered

    def _note_sizes(self, group, types: list[TensorType]) -> dict[tuple[int, int], tuple[int, int]]:
        """Remember the group's sizes; {(leaf, axis): (size before, size now)} for the dims
        that change for the first time with this call."""
        seen = self._sizes_seen.get(group)
        if seen is None:
            if len(self._sizes_seen) >= 4 * self.cache_size:      # (a Python value that changes every call)
                oldest = next(iter(self._sizes_seen))
                del self._sizes_seen[oldest]
                self._static_only.discard(oldest)
            self._sizes_seen[group] = [list(t.shape) for t in types]
            return {}
        changed = {}
        for leaf, (sizes, t) in enumerate(zip(seen, types)):
            for axis, (before, now) in enumerate(zip(sizes, t.shape)):
                if before is not None and before != now:
                    changed[leaf, axis] = (before, now)
                    sizes[axis] = None
        return changed

    def _dynamic_dims(self, group, types: list[TensorType], labels: list[str], args: tuple,
                      kwargs: dict) -> dict[tuple[int, int], str]:
        """{(leaf, axis): size name} of the dims to trace as symbolic sizes: those `dynamic`
        names or (True) all, and those whose size changed in the group; only sizes >= 2.
        Equal sizes share a name (a name `dynamic` gave, else s0, s1, ...)."""
        from ..lower.llvm.entry_sizes import ShapeEquations
        explicit: dict[int, dict[int, str]] = {}
        if isinstance(self.dynamic, dict):
            explicit = _dynamic_leaves(self.fn, args, self.dynamic, kwargs)
            spec = [[explicit.get(leaf, {}).get(axis) for axis in range(len(t.shape))] for leaf, t in enumerate(types)]
            ShapeEquations([[d and Dim.named(d, 1) for d in s] for s in spec], labels).bind(
                [t.shape for t in types], least=0)                 # one name is one size
        if self.dynamic is False or group in self._static_only:
            return {}
        seen = self._sizes_seen[group]
        chosen = {(leaf, axis): explicit.get(leaf, {}).get(axis)
                  for leaf, t in enumerate(types) for axis, size in enumerate(t.shape)
                  if size >= 2 and (self.dynamic is True or seen[leaf][axis] is None or axis in explicit.get(leaf, {}))}
        names = {types[leaf].shape[axis]: name for (leaf, axis), name in reversed(chosen.items()) if name}
        taken, fresh = set(names.values()), (f"s{i}" for i in itertools.count())
        for (leaf, axis), name in chosen.items():
            if name is None:
                size = types[leaf].shape[axis]
                if size not in names:
                    names[size] = next(n for n in fresh if n not in taken)
                chosen[leaf, axis] = names[size]
        return chosen

    def _donated_leaves(self, args: tuple) -> frozenset:
        """The positions, among the flattened tensor inputs, of the donated arguments' leaves."""
        for i in self.donate_argnums:
            if i >= len(args):
                raise ArgumentError(f"tc.trace({self.__name__}): donate_argnums has {i}, but the call "
                                    f"passes {len(args)} positional argument(s)")
        leaves, start = set(), 0
        for i, arg in enumerate(args):
            count = len(pytree.flatten(arg, _is_array_leaf)[0])
            if i in self.donate_argnums:
                if count == 0:
                    raise ArgumentError(f"tc.trace({self.__name__}): argument {i} is donated "
                                        f"(donate_argnums) but holds no tensor: {arg!r}")
                leaves.update(range(start, start + count))
            start += count
        return frozenset(leaves)

    def _trace(self, structure, tensors: list[Tensor], types: list[TensorType] | None = None,
               bake: bool = False, donated: frozenset = frozenset(), key=None) -> Lowered:
        """A fresh trace at `structure` and the tensors' types (or `types`).  The tensors the
        function closes over become hidden inputs after the arguments, read at every call
        (closures.py), or constants where `bake` (export: a library has no Python to read
        them from).  `donated`: the donated inputs' positions; `key`: its cache key, if cached."""
        from .pipeline import optimize
        graph = Graph(getattr(self.fn, "__name__", "main").replace("<", "").replace(">", "") or "main",
                      types or [t._type for t in tensors])
        ctx = _TimedTraceContext(graph, closure=None if bake else closures.find(self.fn))
        if not bake and self.backend == "cpu" and self.device == "cpu":
            unbacked.enable(ctx)         # value-dependent sizes run in stages (staging.py)
        times: dict[str, float] = {}
        with timings.recording(times), timings.stage("trace"), ctx:
            traced = [ctx.wrap(v) for v in graph.inputs]
            args, kwargs = pytree.unflatten(structure, traced)
            try:
                result = self.fn(*args, **kwargs)
                out_leaves, out_structure = pytree.flatten(result, lambda x: isinstance(x, (Tensor, np.ndarray)))
                graph.outputs = [ctx.value_of(as_tensor(t)) for t in out_leaves]
                # for each output, the first output that is the very same object
                same_leaf = [next(j for j, u in enumerate(out_leaves) if u is t) for t in out_leaves]
                # arguments, then closed-over tensors, changed in place return their new values
                # too, after the results (Lowered.split)
                mutated = tuple(i for i, t in enumerate(traced) if t._version != 0)
                graph.outputs += [ctx.value_of(traced[i]) for i in mutated]
                mutated_hidden = tuple(ctx.changed_lifted())
                graph.outputs += [ctx.value_of(ctx.lifted[i].tensor) for i in mutated_hidden]
            finally:
                ctx.restore_lifted()
        self._warn_baked_arrays(ctx.baked_arrays)
        steps = getattr(ctx, "host_steps", [])
        if steps:
            staging.move_results_last(graph, steps)
        with timings.recording(times), timings.stage("passes"):
            optimized = optimize(graph)
        hidden = closures.Reader([h.source for h in ctx.lifted], [h.tensor for h in ctx.lifted]) \
            if ctx.lifted else None
        lowered = Lowered(graph, optimized, out_structure, ctx.backward_ops, backend=self.backend,
                          device=self.device, same_leaf=same_leaf, mutated_inputs=mutated, hidden=hidden,
                          mutated_hidden=mutated_hidden, donated_inputs=donated, fastmath=self.fastmath,
                          check_indices=self.check_indices, compile_times=times, cache_key=key,
                          host_steps=steps)
        if self.backend == "interp":
            lowered._log_compile()
        return lowered

    def _warn_baked_arrays(self, arrays: list[tuple[str, Any]]) -> None:
        """A UserWarning the first time this function bakes a closed-over NumPy array of more
        than closures.WARN_ELEMENTS elements into a trace: later changes to it are not seen."""
        for name, array in arrays:
            if array.size <= closures.WARN_ELEMENTS or name in self._warned_arrays:
                continue
            self._warned_arrays.add(name)
            warnings.warn(f"tc.trace({self.__name__}): the NumPy array {name} (shape {array.shape}, "
                          f"{array.dtype}) that the function closes over is baked into the trace as a "
                          "constant: later changes to it are not seen. Pass it as an argument, or hold "
                          "it in a tc.Tensor (closed-over tensors are read at every call)",
                          UserWarning, stacklevel=user_stacklevel())

    def _note_retrace(self, key, logged: bool = False) -> None:
        if self._history and not logged:
            log.info("retracing %s: %s", self.__name__, _explain_change(self._history[-1], key))
        self._history.append(key)
        if self._warned:                  # only the last signature is still needed (the log)
            del self._history[:-1]
        if len(self._history) > self.max_retraces and not self._warned:
            self._warned = True
            lines = "\n".join([f"  0: {_explain_key(self._history[0])}"] + [
                f"  {i}: {_explain_change(self._history[i - 1], k)}" for i, k in enumerate(self._history) if i])
            warnings.warn(f"tc.trace: {self.__name__} was traced {len(self._history)} times "
                          f"(more than {self.max_retraces}); every new shape, dtype or Python "
                          f"scalar value retraces (NumPy scalars are data and do not). The first "
                          f"signature, then what changed at each retrace:\n{lines}", stacklevel=3)


# The closure walk enters a traced function through the function it runs (not its compiled
# signatures), and two pickled copies are the same where their options and functions are.
closures.register(TracedFunction, closures.Container(wraps="fn", state=lambda t: (t._options, t.fn)))


def _parameters(fn: Callable) -> list[str]:
    """The names of `fn`'s parameters that take positional arguments, in order."""
    import inspect
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _dynamic_leaves(fn: Callable, args: tuple | None, dynamic: dict, kwargs: dict | None = None,
                    examples: bool = False) -> dict[int, dict[int, str]]:
    """{flattened tensor leaf: {axis: size name}} for `dynamic` = {arg: {axis: name}}, where
    arg is a position or a parameter name of `fn` (passed by position, or by keyword in
    `kwargs`) and the argument must be one tensor.  `args` None: only the spec's form is
    checked.  `examples` (export): the arguments are examples, and each size must be >= 1
    and one name one size."""
    params = _parameters(fn)
    if not isinstance(dynamic, dict):
        raise ArgumentError(f"dynamic= must be a dict like {{'x': {{0: 'batch'}}}}, got {dynamic!r}")
    for key, axes in dynamic.items():
        if not isinstance(axes, dict) or not axes:
            raise ArgumentError(f"dynamic=: argument {key!r} needs a dict of {{axis: size name}}, got {axes!r}")
        for axis, name in axes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ArgumentError(f"dynamic=: argument {key!r} axis {axis}: the size name must be "
                                    f"an identifier, got {name!r}")
    if args is None:
        return {}
    kwargs = kwargs or {}
    starts, at = {}, 0
    for i, a in enumerate(args):
        starts[i] = at
        at += len(pytree.flatten(a, _is_array_leaf)[0])
    for k, a in kwargs.items():
        starts[k] = at
        at += len(pytree.flatten(a, _is_array_leaf)[0])
    out: dict[int, dict[int, str]] = {}
    seen: dict[str, tuple] = {}           # size name -> (example size, where)
    for key, axes in dynamic.items():
        pos = key if isinstance(key, int) and not isinstance(key, bool) else \
            params.index(key) if key in params and params.index(key) < len(args) else key
        if pos not in starts or (isinstance(key, int) and not 0 <= pos < len(args)):
            known = ", ".join(params[:len(args)] + list(kwargs)) or f"positions 0..{len(args) - 1}"
            raise ArgumentError(f"dynamic=: {key!r} is not an argument of {getattr(fn, '__name__', 'fn')} "
                                f"(arguments: {known})")
        arg = args[pos] if isinstance(pos, int) else kwargs[pos]
        leaves = pytree.flatten(arg, _is_array_leaf)[0]
        if len(leaves) != 1:
            raise ArgumentError(f"dynamic=: argument {key!r} must be one tensor, not a "
                                f"{type(arg).__name__} of {len(leaves)} tensors")
        shape = np.shape(leaves[0])
        fixed = {}
        for axis, name in axes.items():
            if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
                raise ArgumentError(f"dynamic=: argument {key!r} has shape {shape}; axis {axis!r} "
                                    "is not one of its dims")
            if examples and shape[axis] < 1:
                raise ArgumentError(f"dynamic=: argument {key!r} axis {axis}: the example size is "
                                    f"{shape[axis]}; give an example of size >= 1")
            size, where = shape[axis], f"{key!r} axis {axis}"
            if examples and seen.setdefault(name, (size, where))[0] != size:
                raise ArgumentError(f"dynamic=: size {name!r} is {seen[name][0]} at {seen[name][1]} but "
                                    f"{size} at {where} in the example inputs; one name is one size")
            fixed[axis % len(shape)] = name
        out[starts[pos]] = fixed
    return out


def _leaf_labels(fn: Callable, structure) -> list[str]:
    """Each tensor leaf of a call, as messages name it: `x`, `batch[0]`, `params['w']` (the
    function's parameter names for its positional arguments)."""
    params, out = _parameters(fn), []

    def walk(s, path: str) -> None:
        if s == pytree.LEAF:
            out.append(path)
            return
        kind, body = s
        if kind == "static":
            return
        for k, v in (body if kind == "dict" else enumerate(body)):
            walk(v, f"{path}[{k!r}]")
    args, kwargs = structure[1]
    for i, s in enumerate(args[1]):
        walk(s, params[i] if i < len(params) else f"args[{i}]")
    for k, s in kwargs[1]:
        walk(s, str(k))
    return out


def _signature_items(key) -> list[tuple[str, str]]:
    structure, types = key
    paths = pytree.leaf_paths(structure[1][0], "args") + pytree.leaf_paths(structure[1][1], "kwargs")
    statics, it = [], iter(types)

    def walk(s):
        if s == pytree.LEAF:
            statics.append(describe_leaf(next(it)))
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
    return "; ".join(changes) or ("the same signature again (evicted from the cache, a closed-over tensor changed, "
                                   "or tc.autocast's state differs)")


def _with_dims(types: list[TensorType], dims: dict[tuple[int, int], str]) -> list[TensorType]:
    """`types` with the dims `dims` names ({(leaf, axis): name}) as symbolic sizes."""
    out = list(types)
    for (leaf, axis), name in dims.items():
        shape = list(out[leaf].shape)
        shape[axis] = Dim.named(name, max(shape[axis], DYNAMIC_HINT))
        out[leaf] = TensorType(tuple(shape), types[leaf].dtype)
    return out


class ShapeDtype(collections.namedtuple("ShapeDtype", "shape dtype")):
    """An array's shape and NumPy dtype without its data (TracedFunction.eval_shape)."""

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _is_shaped_leaf(x: Any) -> bool:
    return _is_array_leaf(x) or (hasattr(x, "shape") and hasattr(x, "dtype"))   # ShapeDtype, Dask arrays...


def _spec_type(x) -> TensorType:
    if isinstance(x, Tensor):
        return x._type
    return TensorType(tuple(int(d) for d in x.shape), from_numpy(np.dtype(x.dtype)))


def trace(fn: Callable | None = None, *, backend: str = "cpu",
          max_retraces: int = DEFAULT_MAX_RETRACES, device: str = "cpu",
          donate_argnums: int | tuple[int, ...] = (), fastmath=False, cache_size: int = DEFAULT_CACHE_SIZE,
          check_indices: bool = True, dynamic=None):
    """Compile `fn` on its first call per input signature; usable as @trace or trace(fn).
    The signature is the pytree structure, each tensor's shape and dtype, and each other
    value by type and bits (1, 1.0 and True differ; a NaN is one signature).  The last
    `cache_size` signatures used keep their compiled code; older ones are dropped and
    compile again if they come back.

    dynamic (torch.compile's convention; CPU only): None (default) compiles the first call
    for its shapes; a later call whose signature differs from one compiled only in sizes
    compiles once more with the dims that changed as sizes known at run time, and that
    program serves every later size (a growing sequence compiles twice).  A size of 0 or 1
    keeps a compile of its own, and a function that reads a size as a number (`if
    x.shape[0] > 4:`, `range(n)`) compiles each shape (TRACECOMP_LOG=1 logs why).  True: every
    dim of every tensor argument is dynamic from the first call; False: every shape
    compiles its own program; a dict as tc.export's, `{"x": {1: "seq"}, "mask": {0: "seq"}}`
    (argument name or position -> {axis: size name}), makes those dims dynamic from the
    first call (an ArgumentError where one name takes two sizes in a call, a
    DynamicShapeError where the size cannot flow through the function), others as None.
    device="cuda" runs it on the first CUDA GPU (lower/nvptx, runtime/cuda); its "ptx" stage prints
    without one.  It takes tensors in GPU memory (x.to("cuda")) as they are and host arrays
    by a copy, and returns tensors in GPU memory; its launches are queued without waiting.
    There `dynamic` takes effect only where given (True or a dict): its kernels then take
    the sizes as parameters and their grids follow them (runtime/cuda/runner.py); by
    default each shape compiles its own kernels.

    donate_argnums (JAX's convention): positions of arguments whose memory the caller gives
    up, so that outputs of the same shape and dtype may be written into it (an SGD step
    returning updated weights).  Where an output does reuse a donated array, that array now
    holds the output and shares memory with the returned tensor; where no output can reuse
    it safely (lowering/donation.py) it is left unchanged.  Either way, treat a donated
    argument's old values as gone and rebind the name: `w = step(w, x)`.  A donated
    tc.Tensor is not invalidated (unlike JAX): it simply holds the new values.  Only
    C-contiguous, writable arrays of the right dtype that share no memory with another
    argument are written; others are copied first.  The CPU backend and device="cuda" (a
    donated GPU tensor's memory) reuse memory; the interpreter ignores donation.

    fastmath (Numba's convention): False (default) keeps IEEE semantics, except that float
    reductions may sum in any order; True lets LLVM assume no NaN or inf, ignore the sign of
    zero, use reciprocals, contract to FMA and reassociate everywhere in the CPU code (all
    its fast-math flags); or a set of those flag names ("nnan", "ninf", "nsz", "arcp",
    "contract", "afn", "reassoc").  Results may then differ in the last bits, and NaN/inf
    inputs give undefined results.

    check_indices=False is UNSAFE: indices the function computes (`x[i + 1]`, a gather of
    `i * k`, an assignment `y[j] = v`) are then clamped into range unchecked, so an index
    out of range silently reads or writes the nearest element instead of raising ShapeError
    as it does eagerly.  Index arguments are still checked.  By default (True) the compiled
    code checks every computed index that is not known to lie in range, at the cost of a
    compare per index."""
    options = (backend, max_retraces, device, donate_argnums, fastmath, cache_size, check_indices, dynamic)
    if fn is None:
        return lambda f: TracedFunction(f, *options)
    return TracedFunction(fn, *options)
