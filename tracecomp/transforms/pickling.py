"""Traced functions across processes: what a pickle carries, what the receiver rebuilds.

A TracedFunction pickles as its function, options, signatures and identity, without native
code (TracedFunction.__reduce__).  cloudpickle sends a function of `__main__` (or of a module
registered by value) with its code, closure values and the globals it names, as they are at
pickling time.  Dask sends the function with every task, so a worker receives copies of one
function (one identity) again and again.  `rebuild` keeps the copy that arrived before, with
its compiled signatures, while each new arrival carries the same state (`same_state`: code,
defaults, closure values, named globals, compared by value), and starts over from the new
arrival when anything differs (a global the client changed since): the new copy traces
again, and its compile is a compile-cache load wherever the resulting code is unchanged (the
cache key is the generated code, which holds every value the trace baked in).
"""
from __future__ import annotations

import collections
import functools
import logging
import struct
import sys
import types
from typing import Any, Callable

import numpy as np

from .closures import code_names, container_of
from ..tensors.tensor import Tensor

log = logging.getLogger("tracecomp.transforms.trace")

DYNAMIC_CODE = "<dynamic-code>"      # cloudpickle's file name for code it sends by value
MAX_ARRIVED = 32                     # functions (identities) whose last arrival is kept
MAX_COMPARED = 100_000               # objects same_state looks at before it calls them different

_ARRIVED: collections.OrderedDict[str, Any] = collections.OrderedDict()   # identity -> TracedFunction
_MISSING = object()


def functions(fn) -> list:
    """`fn` and the functions it brings along: those in its closure, and those of its own
    module that it (or they) can reach through globals."""
    out, seen = [], set()

    def visit(f) -> None:
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            return
        seen.add(id(f))
        out.append(f)
        for cell in f.__closure__ or ():
            try:
                visit(cell.cell_contents)
            except ValueError:                # a cell not filled yet
                pass
        for name in f.__code__.co_names:
            g = f.__globals__.get(name)
            if isinstance(g, types.FunctionType) and g.__module__ == f.__module__:
                visit(g)
    visit(fn)
    return out


def source_files(fn) -> dict:
    """Where each function `fn` brings along was written: (name, first line) -> file."""
    return {(f.__code__.co_name, f.__code__.co_firstlineno): f.__code__.co_filename for f in functions(fn)}


def restore_source_files(fn, files: dict | None) -> None:
    """Name again the files of the functions cloudpickle sent by value with `fn` (it replaces
    them with DYNAMIC_CODE): errors and graph locations on a Dask worker then point at the
    user's file and line."""
    for f in functions(fn) if files else ():
        code = f.__code__
        filename = files.get((code.co_name, code.co_firstlineno))
        if code.co_filename == DYNAMIC_CODE and filename:
            f.__code__ = _renamed(code, filename)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def portable(fn: Callable) -> Any:
    """`fn` for TracedFunction.__reduce__: as it is, or, where its module is registered with
    cloudpickle to travel by value, its cloudpickle bytes.  A plain pickle (Dask tries one
    first) would name such a function by reference, and a worker would import the module
    and compute with its own globals instead of the client's."""
    cloudpickle = sys.modules.get("cloudpickle")
    registry = getattr(cloudpickle, "list_registry_pickle_by_value", None)
    if registry is None or getattr(fn, "__module__", None) not in registry():
        return fn
    return _ByValue(cloudpickle.dumps(fn))


class _ByValue:
    """A function's cloudpickle bytes, inside a plain pickle; unpickles as the function."""

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self):
        return _load_by_value, (self.data,)


def _load_by_value(data: bytes) -> Callable:
    import cloudpickle
    return cloudpickle.loads(data)


def rebuild(cls: type, fn: Callable, options: tuple, signatures: list, identity: str, files: dict | None = None):
    """A TracedFunction (`cls`, which the pickle names, as trace.py imports this module)
    arriving from a pickle: nothing compiled yet, the signatures known.
    A copy of a function that arrived before, carrying the same state, is that earlier copy
    (with its compiled signatures); one whose state differs replaces it.  Invariant: the
    function returned computes with the state that this pickle carried."""
    restore_source_files(fn, files)
    traced = _ARRIVED.get(identity)
    if traced is not None and not same_state(traced.fn, fn):
        log.info("a new copy of %s arrived with other globals or closure values: traced again",
                 getattr(fn, "__name__", "fn"))
        traced = None
    if traced is None:
        traced = cls(fn, *options)
        traced._history = list(signatures)
        traced._identity = identity
        _ARRIVED[identity] = traced
        while len(_ARRIVED) > MAX_ARRIVED:
            _ARRIVED.popitem(last=False)
    _ARRIVED.move_to_end(identity)
    return traced


def same_state(a: Any, b: Any) -> bool:
    """Whether `a` and `b` (a function and its copy from another pickle) compute the same:
    equal code, and equal values (bit for bit, for arrays and floats) everywhere their
    defaults, closures and named globals lead.  Conservative: what it cannot compare, or
    more than MAX_COMPARED objects, counts as different."""
    try:
        return _Compare().same(a, b)
    except _TooLarge:
        return False


class _TooLarge(Exception):
    pass


class _Compare:
    def __init__(self):
        self.pairs: set[tuple[int, int]] = set()   # pairs being (or already) compared: cycles end here
        self.count = 0

    def same(self, a: Any, b: Any) -> bool:
        if a is b:
            return True
        if type(a) is not type(b):
            return False
        if isinstance(a, (type(None), bool, int, str, bytes, complex)):
            return a == b
        if isinstance(a, float):
            return struct.pack("<d", a) == struct.pack("<d", b)
        if isinstance(a, (type, types.ModuleType, types.BuiltinFunctionType)):
            return False                 # distinct classes and modules (a is b failed above)
        pair = (id(a), id(b))
        if pair in self.pairs:
            return True
        self.pairs.add(pair)
        self.count += 1
        if self.count > MAX_COMPARED:
            raise _TooLarge
        return self._compound(a, b)

    def _compound(self, a: Any, b: Any) -> bool:
        if isinstance(a, types.FunctionType):
            return self._function(a, b)
        if isinstance(a, types.MethodType):
            return self.same(a.__func__, b.__func__) and self.same(a.__self__, b.__self__)
        if isinstance(a, functools.partial):
            return self.same((a.func, a.args, a.keywords), (b.func, b.args, b.keywords))
        if isinstance(a, np.ndarray):
            return _same_array(a, b)
        if isinstance(a, np.generic):
            return a.dtype == b.dtype and a.tobytes() == b.tobytes()
        if isinstance(a, Tensor):
            return (a._type == b._type and a.requires_grad == b.requires_grad and a._data is not None
                    and b._data is not None and _same_array(a._data, b._data))
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(self.same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            return list(a) == list(b) and all(self.same(a[k], b[k]) for k in a)
        if isinstance(a, (set, frozenset)):
            return a == b
        container = container_of(a)         # a traced function, a tc.nn module (closures.register)
        if container is not None and container.state is not None:
            return self.same(container.state(a), container.state(b))
        if isinstance(getattr(a, "__dict__", None), dict):
            return self.same(vars(a), vars(b))
        try:
            return (a == b) is True
        except Exception:                # noqa: BLE001 - not comparable: different
            return False

    def _function(self, a: types.FunctionType, b: types.FunctionType) -> bool:
        if a.__code__ != b.__code__ or not self.same(a.__defaults__, b.__defaults__) \
                or not self.same(a.__kwdefaults__, b.__kwdefaults__):
            return False
        cells = [(x.cell_contents if _filled(x) else _MISSING, y.cell_contents if _filled(y) else _MISSING)
                 for x, y in zip(a.__closure__ or (), b.__closure__ or ())]
        if not all(self.same(x, y) for x, y in cells):
            return False
        names = code_names(a.__code__)
        return all(self.same(a.__globals__.get(n, _MISSING), b.__globals__.get(n, _MISSING)) for n in names)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape, dtype and bits (a NaN equals the same NaN; -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.hasobject:
        return False
    if a.size == 0:
        return True
    return np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
