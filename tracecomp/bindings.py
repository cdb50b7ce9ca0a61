"""The Python API generated from ops.yaml: module functions, Tensor methods, operators, properties.

For each operator name, the overloads are tried in table order and the first whose
schema binds the call wins (seed 003's PythonArgParser).  Binding checks each argument
against its schema type and normalises it (int lists to tuples, NumPy scalars to Python
numbers, dtypes to DType); a call that matches no overload raises an ArgumentError
listing every signature and why it did not match.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .core.locations import user_location
from .core import dtypes as dt
from .dispatch.dispatcher import dispatcher
from .core.devices import CPU, Device, default_device
from .core.errors import ArgumentError, TracecompError, add_location
from .ops.schema import Argument
from .library.assignment import inplace, setitem
from .ops.table import VIEW_KINDS, OpDef
from .tensors.tensor import Tensor, as_tensor, check_fresh, foreign_name, is_foreign
from .core.symbolic import Dim
from .dispatch import api as tc
from .runtime.devices import transfer


class _Mismatch(Exception):
    pass


def _type_name(v: Any) -> str:
    if isinstance(v, Tensor):
        return "Tensor"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__} of [{', '.join(_type_name(x) for x in v)}]"
    return type(v).__name__


def _is_int(v) -> bool:
    """An int, NumPy integer or symbolic size (a traced dynamic dim, symbolic.py)."""
    return isinstance(v, (int, np.integer, Dim)) and not isinstance(v, (bool, np.bool_))


def _int(v):
    return v if isinstance(v, Dim) else int(v)


def _scalar(v):
    """Python number from bool/int/float or NumPy scalar; None if `v` is not a scalar."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if _is_int(v):
        return _int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return None


def _is_number(v) -> bool:
    return _is_int(v) or isinstance(v, (float, np.floating))


def _convert(op: OpDef, arg: Argument, v: Any) -> Any:
    """Check `v` against the argument's schema type and normalise it, or raise _Mismatch."""
    t = arg.type
    if v is None:
        if t.optional:
            return None
        raise _Mismatch(f"argument '{arg.name}' must be {t}, not None")
    base = t.base
    if base == "Tensor" and t.is_list:
        if isinstance(v, (list, tuple)) and all(isinstance(x, (Tensor, np.ndarray)) or is_foreign(x)
                                                or (x is None and t.elem_optional) for x in v):
            return [None if x is None else as_tensor(x) for x in v]
    elif base == "Tensor":
        if isinstance(v, (Tensor, np.ndarray)) or is_foreign(v):
            return as_tensor(v)        # a torch.Tensor shares its memory (DLPack)
        if op.kind == "elementwise" and _scalar(v) is not None:
            return _scalar(v)      # a weak scalar operand
    elif base == "Scalar":
        if _scalar(v) is not None:
            return _scalar(v)
    elif base == "int" and t.is_list:
        if t.list_size and _is_int(v):
            return (_int(v),) * t.list_size
        if t.list_size and isinstance(v, (list, tuple)) and len(v) == 1 and _is_int(v[0]):
            return (_int(v[0]),) * t.list_size       # int[2] takes [k] for (k, k), as PyTorch
        if isinstance(v, (list, tuple)) and all(_is_int(x) or (x is None and t.elem_optional) for x in v):
            return tuple(None if x is None else _int(x) for x in v)
    elif base == "float" and t.is_list:         # float[1]: a lone number stands for the list
        if t.list_size and _is_number(v):
            return (float(v),) * t.list_size
        if isinstance(v, (list, tuple)) and all(_is_number(x) for x in v):
            return tuple(float(x) for x in v)
    elif base == "int":
        if _is_int(v):
            return _int(v)
    elif base == "float":
        if _is_number(v):
            return float(v)
    elif base == "bool":
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
    elif base == "str":
        if isinstance(v, str):
            return v
    elif base == "ScalarType":
        try:
            return dt.to_dtype(v)
        except TracecompError as e:
            raise _Mismatch(f"argument '{arg.name}': {e}") from None
    elif base == "Device":
        return _check_device(arg.name, v)
    elif base == "MemoryFormat":
        return _check_memory_format(arg.name, v)
    raise _Mismatch(f"argument '{arg.name}' must be {t}, not {_type_name(v)}")


def _check_device(name: str, v) -> Device | None:
    """device="cpu", "cuda", "cuda:0", a tc.device or a torch.device (None stays None)."""
    if v is None:
        return None
    try:
        return Device(v)
    except TracecompError as e:
        raise _Mismatch(f"argument '{name}': {e}") from None


MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")


def _check_memory_format(name: str, v) -> None:
    """One of PyTorch's memory formats (or its name).  A format changes only strides, never
    values, and tracecomp's tensors are values whose layout the compiler picks: every
    format gives the same tensor (channels_last included: a request, not a meaning)."""
    if str(v).removeprefix("torch.") in MEMORY_FORMATS:
        return None
    raise _Mismatch(f"argument '{name}' must be a memory format ({', '.join(MEMORY_FORMATS)}), "
                    f"not {v!r}")


_NO_SELF = object()


def bind(op: OpDef, args: tuple, kwargs: dict, self_arg: Any = _NO_SELF) -> dict[str, Any]:
    """Bind a Python call to this overload's schema, or raise _Mismatch saying why not.

    Methods pass the tensor as `self_arg`; it binds to the argument named `self`.
    """
    params = op.schema.arguments
    given: dict[str, Any] = {} if self_arg is _NO_SELF else {"self": self_arg}
    positional = [a for a in params if not a.kwarg_only and a.name not in given]
    # `x.reshape(2, 3)`, `tc.zeros(2, 3)`: a lone int-list parameter also takes varargs.
    if (len(positional) == 1 and positional[0].type.base == "int" and positional[0].type.is_list
            and args and all(_is_int(x) for x in args)):
        args = (tuple(args),)
    # `tc.meshgrid(x, y)`, `tc.einsum("ij,jk", a, b)`: a last positional Tensor-list parameter
    # takes the remaining tensors as varargs, too.
    last = len(positional) - 1
    if (positional and positional[-1].type.base == "Tensor" and positional[-1].type.is_list
            and len(args) > last and all(hasattr(x, "shape") and hasattr(x, "dtype") for x in args[last:])):
        args = tuple(args[:last]) + (list(args[last:]),)
    if len(args) > len(positional):
        raise _Mismatch(f"takes {len(positional)} positional argument(s) but {len(args)} were given")
    given.update(zip((a.name for a in positional), args))
    for k, v in kwargs.items():
        if k in given:
            raise _Mismatch(f"got multiple values for argument '{k}'")
        if not any(a.name == k for a in params):
            raise _Mismatch(f"got an unexpected keyword argument '{k}'")
        given[k] = v
    bound = {}
    for a in params:
        if a.name in given:
            bound[a.name] = _convert(op, a, given[a.name])
        elif a.has_default:
            bound[a.name] = a.default_value()
        else:
            raise _Mismatch(f"missing required argument '{a.name}'")
    return bound


def _describe_call(args: tuple, kwargs: dict) -> str:
    parts = [_type_name(a) for a in args] + [f"{k}={_type_name(v)}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"


def call_overloads(name: str, overloads: list[OpDef], args: tuple, kwargs: dict,
                   self_arg: Any = _NO_SELF):
    """Resolve the overload and dispatch; errors name the op and the user's source line.
    Factories (the ops with a `device` argument) also take PyTorch's `requires_grad=`."""
    reasons = []
    requires_grad = False
    if "requires_grad" in kwargs and all(any(a.name == "device" for a in op.schema.arguments) for op in overloads):
        kwargs = dict(kwargs)
        requires_grad = kwargs.pop("requires_grad")
    for op in overloads:
        try:
            bound = bind(op, args, kwargs, self_arg)
        except _Mismatch as m:
            reasons.append((op.schema, str(m)))
            continue
        try:
            for v in bound.values():
                for t in v if isinstance(v, list) else (v,):
                    if isinstance(t, Tensor) and t._view_of is not None:
                        check_fresh(t)
            result = dispatcher.call(op, bound)
            # an op with a device argument (a factory, x.to(device)) puts its result there
            device = bound.get("device") if op.full_name != "to.other" else bound["other"].device
            if device is None and "device" in bound:
                device = default_device()
            if isinstance(device, Device) and isinstance(result, Tensor):
                result = transfer(result, device)
        except TracecompError as e:
            raise add_location(e, str(user_location())) from None
        if op.kind in VIEW_KINDS:
            for t in result if isinstance(result, (list, tuple)) else (result,):
                t._is_view = True
        if requires_grad:
            try:
                result.requires_grad_(bool(requires_grad))
            except TracecompError as e:
                raise add_location(e, str(user_location())) from None
        return result
    lines = "\n".join(f"  * {s}\n      {why}" for s, why in reasons)
    err = ArgumentError(f"{name}() received an invalid combination of arguments - got "
                        f"{_describe_call(args, kwargs)}, but expected one of:\n{lines}")
    raise add_location(err, str(user_location())) from None


def _function(name: str, overloads: list[OpDef]) -> Callable:
    def fn(*args, **kwargs):
        return call_overloads(name, overloads, args, kwargs)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "\n".join(str(op.schema) for op in overloads)
    return fn


def _method(name: str, overloads: list[OpDef]) -> Callable:
    def method(self, *args, **kwargs):
        return call_overloads(name, overloads, args, kwargs, self)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(str(op.schema) for op in overloads)
    return method


def _operator(name: str, overloads: list[OpDef], reflected: bool) -> Callable:
    """`a + b` calls add(a, b); a reflected dunder (`2 - t`) calls sub(2, t).  A torch.Tensor
    on the other side raises: which library's tensor the result should be is not clear."""
    def dunder(self, *other):
        if other and is_foreign(other[0]):
            _mixed(name, other[0], reflected)
        args = (other[0], self) if reflected else (self, *other)
        return call_overloads(name, overloads, args, {})
    return dunder


def _mixed(name: str, other, reflected: bool):
    pair = f"{foreign_name(other)} and a tracecomp.Tensor" if reflected else f"tracecomp.Tensor and a {foreign_name(other)}"
    raise add_location(ArgumentError(
        f"{name}: the operands are a {pair}; convert one first: tc.from_dlpack(t) gives a tracecomp.Tensor "
        f"sharing its memory, torch.from_dlpack(x) a torch.Tensor"), str(user_location()))


def _at_user_line(fn: Callable, *args):
    """fn(*args), a TracecompError from it naming the user's source line."""
    try:
        return fn(*args)
    except TracecompError as e:
        raise add_location(e, str(user_location())) from None


def _setitem(self, index, value):
    _at_user_line(setitem, self, index, value)


_INPLACE = {"__iadd__": "add", "__isub__": "sub", "__imul__": "mul", "__itruediv__": "div",
            "__ifloordiv__": "floor_divide", "__imod__": "remainder", "__ipow__": "pow",
            "__iand__": "bitwise_and", "__ior__": "bitwise_or", "__ixor__": "bitwise_xor"}


def _inplace_operator(dunder: str, name: str) -> Callable:
    def method(self, other):
        return _at_user_line(lambda: inplace(self, getattr(tc, name)(self, other), f"{name}_"))
    method.__name__ = dunder
    return method


def _inplace_method(name: str, overloads: list[OpDef]) -> Callable:
    """`x.add_(y)`: x.add(y) written into x (functionalized like item assignment)."""
    def method(self, *args, **kwargs):
        return _at_user_line(lambda: inplace(self, call_overloads(name, overloads, args, kwargs, self), f"{name}_"))
    method.__name__ = method.__qualname__ = f"{name}_"
    method.__doc__ = "In place: " + "\n".join(str(op.schema) for op in overloads)
    return method


def _written(self, src, what: str):
    """src (a tensor or a number) cast to self's dtype (any cast, as PyTorch's copy_ and
    fill_) and broadcast to its shape, written into self."""
    src = src if isinstance(src, Tensor) else tc.tensor(np.asarray(src))    # a number at full precision
    src = transfer(src, self.device) if self._data is not None else src     # copy_ crosses devices
    return _at_user_line(lambda: inplace(self, tc.broadcast_to(src.to(self.dtype), list(self.shape)), what))


def _zero_(self):
    return _written(self, 0, "zero_")


def _fill_(self, value):
    """Every element set to `value`, a number or a 0-d tensor."""
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ArgumentError(f"fill_: the value must be a number or a 0-d tensor, got shape {tuple(value.shape)}")
    return _written(self, value, "fill_")


def _copy_(self, src, non_blocking: bool = False):
    return _written(self, src, "copy_")


def _getitem(self, index):
    from .library.indexing import getitem
    return _at_user_line(getitem, self, index)


def _cpu(self) -> Tensor:
    """The tensor in host memory: itself when it is there."""
    return transfer(self, CPU)


def _cuda(self, device=None, non_blocking: bool = False) -> Tensor:
    """The tensor in GPU memory (cuda:0): itself when it is there."""
    return transfer(self, Device("cuda" if device is None else device))


def group_by_name(table: dict[str, OpDef]) -> dict[str, list[OpDef]]:
    groups: dict[str, list[OpDef]] = {}
    for op in table.values():
        groups.setdefault(op.name, []).append(op)
    return groups


def install(table: dict[str, OpDef]) -> list[str]:
    """Attach the generated functions to the op namespace (dispatch/api.py) and to Tensor;
    the names of the functions, for the package root to re-export."""
    names = []
    for name, overloads in group_by_name(table).items():
        if any("function" in op.variants for op in overloads):
            setattr(tc, name, _function(name, [op for op in overloads if "function" in op.variants]))
            names.append(name)
        methods = [op for op in overloads if "method" in op.variants]
        if methods:
            setattr(Tensor, name, _method(name, methods))
        in_place = [op for op in overloads if op.inplace]
        if in_place:
            setattr(Tensor, f"{name}_", _inplace_method(name, in_place))
        for op in overloads:
            for dunder in op.operators:
                setattr(Tensor, dunder, _operator(name, overloads, reflected=False))
            for dunder in op.reflected:
                setattr(Tensor, dunder, _operator(name, overloads, reflected=True))
            for prop in op.properties:
                setattr(Tensor, prop, property(_method(name, [op])))
    Tensor.__getitem__ = _getitem
    Tensor.__setitem__ = _setitem
    for dunder, name in _INPLACE.items():
        setattr(Tensor, dunder, _inplace_operator(dunder, name))
    Tensor.zero_, Tensor.fill_, Tensor.copy_ = _zero_, _fill_, _copy_
    Tensor.cpu, Tensor.cuda = _cpu, _cuda
    tc.__all__ += names
    return names
