"""tc.nn.Module and tc.nn.Parameter, with PyTorch's behaviour.

A Module registers what is assigned to its attributes: a Parameter as a parameter, a
Module as a child, a tensor given to `register_buffer` as a buffer.  It is also a pytree
(every subclass registers itself): its leaves are its parameters and buffers, in
`state_dict` order, and everything else (the class, the names, `training`, the other
attributes) is its structure.  So `tc.trace(step)(model, batch)` passes the tensors as
inputs and rebuilds the model around the traced ones; `tc.grad(loss)(model, x)` returns
a model-shaped gradient; `tc.vmap` maps over models.  The structure keys the signature
cache by value for hyper-parameters (ints, floats, strings, tuples of them) and by
identity for other attributes: changing `model.eval()` or a layer's `p` retraces.
"""
from __future__ import annotations

import collections
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from ..tensors import pytree
from ..core import dtypes as dt
from ..core.devices import Device
from ..core.errors import ArgumentError
from ..tensors.tensor import Tensor, as_tensor
from ..transforms import closures
from ..dispatch import api as tc


class Parameter(Tensor):
    """A tensor that a Module registers as a parameter when assigned to an attribute; it
    requires grad by default.  It shares its memory with `data`."""
    __slots__ = ()

    def __init__(self, data: Any = None, requires_grad: bool = True):
        t = as_tensor(np.zeros(0, np.float32) if data is None else data)
        super().__init__(t._data, t._type, t._value, t._trace)
        self._batch = t._batch
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def _hashable(v: Any) -> bool:
    if isinstance(v, (bool, int, float, str, type(None), np.generic)):
        return True
    return isinstance(v, tuple) and all(_hashable(x) for x in v)


class _Static:
    """A module's attributes that are not tensors or children, as pytree structure: equal
    (for the trace cache) when the hyper-parameters are equal by value and every other
    attribute is the very same object."""
    __slots__ = ("attrs", "_key")

    def __init__(self, attrs: dict):
        self.attrs = attrs
        self._key = tuple((k, ("value", v) if _hashable(v) else ("id", id(v))) for k, v in attrs.items())

    def __eq__(self, other) -> bool:
        return isinstance(other, _Static) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


# Bumped by every change to any module's attributes or its parameter, buffer or child tables:
# a module's flattened leaves and structure (`_flat_leaves`, for tc.trace's fast path) stay
# valid while it is unchanged.
_changes = [0]


class _Table(dict):
    """A module's table of parameters, buffers or children: a dict that counts its changes."""

    def __setitem__(self, key, value):
        _changes[0] += 1
        super().__setitem__(key, value)

    def __delitem__(self, key):
        _changes[0] += 1
        super().__delitem__(key)

    def pop(self, *args):
        _changes[0] += 1
        return super().pop(*args)

    def popitem(self):
        _changes[0] += 1
        return super().popitem()

    def clear(self):
        _changes[0] += 1
        super().clear()

    def update(self, *args, **kwargs):
        _changes[0] += 1
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        _changes[0] += 1
        return super().setdefault(key, default)


class Module:
    """The base class of layers and models (PyTorch's nn.Module)."""

    def __init__(self):
        _changes[0] += 1
        object.__setattr__(self, "_parameters", _Table())
        object.__setattr__(self, "_buffers", _Table())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", _Table())
        object.__setattr__(self, "training", True)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _register(cls)

    # ------------------------------------------------------------ registration
    def _check_initialized(self, name: str) -> None:
        if "_parameters" not in self.__dict__:
            raise ArgumentError(f"cannot assign '{name}' before Module.__init__() is called "
                                f"(call super().__init__() first in {type(self).__name__}.__init__)")

    def __setattr__(self, name: str, value: Any) -> None:
        _changes[0] += 1
        if isinstance(value, Parameter):
            self._check_initialized(name)
            self._forget(name)
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._check_initialized(name)
            self._forget(name)
            self._modules[name] = value
        elif "_parameters" in self.__dict__ and name in self._parameters:
            if value is not None and not isinstance(value, Tensor):
                raise ArgumentError(f"cannot assign a {type(value).__name__} as parameter '{name}' of "
                                    f"{type(self).__name__} (a tc.nn.Parameter, a tensor or None expected)")
            self._parameters[name] = value
        elif "_buffers" in self.__dict__ and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise ArgumentError(f"cannot assign a {type(value).__name__} as buffer '{name}' of "
                                    f"{type(self).__name__} (a tensor or None expected)")
            self._buffers[name] = value
        elif "_modules" in self.__dict__ and name in self._modules and value is None:
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        for d in (self._parameters, self._buffers, self._modules):
            d.pop(name, None)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for where in ("_parameters", "_buffers", "_modules"):
            if where in d and name in d[where]:
                return d[where][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        _changes[0] += 1
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._check_name(name)
        if param is not None and not isinstance(param, Parameter):
            raise ArgumentError(f"register_parameter('{name}'): a tc.nn.Parameter or None expected, "
                                f"got {type(param).__name__}")
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        self._check_name(name)
        self._forget(name)
        self._buffers[name] = None if tensor is None else as_tensor(tensor)
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        self._check_name(name)
        if module is not None and not isinstance(module, Module):
            raise ArgumentError(f"add_module('{name}'): a tc.nn.Module expected, got {type(module).__name__}")
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    def _check_name(self, name: str) -> None:
        self._check_initialized(name)
        if not isinstance(name, str) or not name or "." in name:
            raise ArgumentError(f"{type(self).__name__}: a parameter, buffer or module name must be a "
                                f"non-empty str without '.', got {name!r}")

    # ------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def _named(self, where: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Tensor]]:
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in modules:
            for name, t in getattr(m, where).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    def apply(self, fn: Callable[["Module"], Any]) -> "Module":
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------ modes and gradients
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise ArgumentError(f"train(mode): mode must be a bool, got {type(mode).__name__}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        _changes[0] += 1
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is not None:
                p.grad = None if set_to_none else tc.zeros_like(p.grad)

    # ------------------------------------------------------------ state dicts
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> "collections.OrderedDict[str, Tensor]":
        """Parameters and persistent buffers by dotted name (detached unless keep_vars)."""
        out = collections.OrderedDict()
        for mod_prefix, m in self.named_modules(prefix.rstrip(".")):
            dot = f"{mod_prefix}." if mod_prefix else ""
            for name, p in m._parameters.items():
                if p is not None:
                    out[dot + name] = p if keep_vars else p.detach()
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent:
                    out[dot + name] = b if keep_vars else b.detach()
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True, where: str | None = None):
        """Copy `state_dict`'s values into the parameters and buffers.  Shapes and dtypes must
        match (tracecomp does not cast a checkpoint silently); with strict, missing and
        unexpected keys are an error too.  One StateDictError (a RuntimeError and a
        CheckpointError) lists every problem in PyTorch's words and names `where` (by default
        the file tc.load_state read); nothing is copied then.  Returns PyTorch's
        (missing_keys, unexpected_keys)."""
        from ..autograd.grad_mode import no_grad
        from .state import check_loadable
        own = self.state_dict(keep_vars=True)
        where = where or getattr(state_dict, "source", None)
        values, keys = check_loadable(type(self).__name__, own, state_dict, strict, where)
        with no_grad():
            for k, value in values.items():
                own[k].copy_(value)
        return keys

    # ------------------------------------------------------------ conversions
    def to(self, *args, **kwargs) -> "Module":
        """The parameters and buffers moved to a device and/or their floating-point ones cast
        to a dtype, in place: the same tensor objects (as PyTorch sets param.data), so an
        optimizer made before still holds them.  `to("cuda")`, `to(tc.float64)`,
        `to("cuda", tc.float64)`, `to(device=..., dtype=...)`."""
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(f"Module.to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, (str, Device)) and not (isinstance(a, str) and a in dt.DType.__members__) \
                    or type(a).__name__ == "device":       # (a torch.device too)
                device = a
            else:
                dtype = a
        dtype = None if dtype is None else _floating(dtype)
        for t in list(self.parameters()) + list(self.buffers()):
            moved = t.detach()
            if dtype is not None and t.dtype.is_floating_point and t.dtype != dtype:
                moved = moved.to(dtype)
            if device is not None:
                moved = moved.to(device)
            if moved._data is not t._data or moved._type != t._type:
                t._data, t._type, t._value, t._trace = moved._data, moved._type, moved._value, moved._trace
                if t.grad is not None:       # a gradient follows its parameter, as in PyTorch
                    t.grad = t.grad.to(device) if device is not None else t.grad
                    t.grad = t.grad.to(t.dtype) if t.grad.dtype.is_floating_point else t.grad
        return self

    def cuda(self, device=None) -> "Module":
        return self.to(Device("cuda" if device is None else device))

    def cpu(self) -> "Module":
        return self.to(Device("cpu"))

    def float(self) -> "Module":
        return self.to(tc.float32)

    def double(self) -> "Module":
        return self.to(tc.float64)

    def bfloat16(self) -> "Module":
        return self.to(dt.BFLOAT16)

    def half(self) -> "Module":
        return self.to(dt.FLOAT16)

    # ------------------------------------------------------------ calling and printing
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        """PyTorch's layout: `Linear(in_features=2, ...)` on one line, children indented."""
        own = [line for line in self.extra_repr().split("\n") if line]
        children = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        if len(own) == 1 and not children:
            return f"{type(self).__name__}({own[0]})"
        body = own + children
        return f"{type(self).__name__}(" + ("\n  " + "\n  ".join(body) + "\n" if body else "") + ")"

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))


# ---------------------------------------------------------------- the pytree of a module
_SLOTS = ("_parameters", "_buffers", "_modules")


def _floating(dtype) -> dt.DType:
    d = dt.to_dtype(dtype)
    if not d.is_floating_point:
        raise ArgumentError(f"Module.to: casts only floating-point parameters and buffers, so it takes a "
                            f"floating dtype (bfloat16, float16, float32, float64), got {d.label}")
    return d


def _flatten(m: Module):
    """Children: every parameter, buffer and child module, None included (a None child is
    static structure in a flattened tree); aux: their names and every other attribute."""
    names, children = [], []
    for where in _SLOTS:
        for k, v in getattr(m, where).items():
            names.append((where, k))
            children.append(v)
    rest = {k: v for k, v in m.__dict__.items() if k not in _SLOTS}
    return children, (tuple(names), _Static(rest))


def _buffers(aux) -> list[int]:
    """The positions of the buffers among the children: constants for tc.grad."""
    return [i for i, (where, _) in enumerate(aux[0]) if where == "_buffers"]


def _rebuild(cls: type, aux, children) -> Module:
    names, static = aux
    m = object.__new__(cls)
    m.__dict__.update(static.attrs)
    for where in _SLOTS:
        m.__dict__[where] = _Table()
    for (where, k), v in zip(names, children):
        dict.__setitem__(m.__dict__[where], k, v)      # a new module changes no remembered one
    return m


_flat: "weakref.WeakKeyDictionary[Module, tuple]" = weakref.WeakKeyDictionary()


def _flat_leaves(m: Module, is_leaf):
    """(structure key, leaves, scratch) of `m` as pytree.flatten and cache_key give them,
    remembered while no module changes (`_changes`); None where a leaf is not a plain tensor."""
    memo = _flat.get(m)
    if memo is not None and memo[0] == _changes[0] and memo[1] is is_leaf:
        return memo[2:]
    leaves, structure = pytree.flatten(m, is_leaf)
    if not all(type(t) in (Tensor, Parameter) for t in leaves):
        return None
    memo = _flat[m] = (_changes[0], is_leaf, pytree.cache_key(structure), leaves, {})
    return memo[2:]


def _register(cls: type) -> None:
    pytree.register_pytree_node(cls, _flatten, lambda aux, children: _rebuild(cls, aux, children), _buffers)
    pytree.register_fast_flatten(cls, _flat_leaves)


_register(Module)
# tc.trace's closure walk reads a module's parameters, buffers and submodules by name
closures.register(Module, closures.Container(tables=_SLOTS))
