"""tc.Tensor: an eager tensor (a NumPy array) or a traced one (an SSA value in a graph).

Operator methods are not written here: bindings.py attaches every method, operator and
property that ops.yaml declares.  This file holds only what is not an op: metadata,
conversion to NumPy/DLPack, printing, and the errors for using a traced value in Python.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.locations import user_location
from ..core import dtypes as dt
from ..core.devices import Device, DeviceBuffer, device_of, dlpack_importers, host_dlpack
from ..core.errors import ArgumentError, DTypeError, TraceError, TracecompError, VmapError, add_location
from ..core.types import TensorType


class Tensor:
    __slots__ = ("_data", "_type", "_value", "_trace", "requires_grad", "grad", "grad_fn",
                 "_output_nr", "_accumulator", "_retains_grad", "_tangent", "_version", "_is_view", "_view_of",
                 "_batch", "__weakref__")
    __array_priority__ = 1000     # NumPy defers `ndarray + Tensor` to Tensor.__radd__
    __array_ufunc__ = None

    def __init__(self, data: np.ndarray | None, type: TensorType, value=None, trace=None,
                 requires_grad: bool = False):
        self._data = data
        self._type = type
        self._value = value       # ir.Value while traced
        self._trace = trace       # the TraceContext that owns _value
        self.requires_grad = requires_grad
        self.grad = None
        self.grad_fn = None         # the autograd Node that made this tensor (None for leaves)
        self._output_nr = 0         # which output of grad_fn this tensor is
        self._accumulator = None    # a leaf's AccumulateGrad node, made on first use
        self._retains_grad = False
        self._tangent = None        # forward-mode tangent (tc.jvp)
        self._version = 0           # bumped by every in-place change (item assignment)
        self._is_view = False       # made by a view op: assigning into it raises (assignment.py)
        self._view_of = None        # (base, index, base's version) when made by basic indexing
        self._batch = None          # (whole batch, level, batched) inside tc.vmap (batching.py)

    def _take_over(self, updated: "Tensor") -> None:
        """Become `updated` (an in-place change, functionalized): its value, trace value,
        autograd history and tangent; this tensor's identity and view flag stay (and its
        batch under tc.vmap: assignment.update hands that over)."""
        self._data, self._value, self._trace = updated._data, updated._value, updated._trace
        # a leaf that requires grad, changed under no_grad (an optimizer's step), stays one
        keep_leaf = self.requires_grad and self.grad_fn is None and updated.grad_fn is None
        self.grad_fn, self._output_nr = updated.grad_fn, updated._output_nr
        self.requires_grad, self._tangent = updated.requires_grad or keep_leaf, updated._tangent
        self._version += 1

    @classmethod
    def from_numpy(cls, array: np.ndarray, requires_grad: bool = False) -> "Tensor":
        array = np.asarray(array)
        dtype = dt.from_numpy(array.dtype)
        if array.dtype != dtype.np or not array.flags.writeable:
            array = array.astype(dtype.np)
        return cls(array, TensorType(tuple(array.shape), dtype), requires_grad=requires_grad)

    # -------------------------------------------------------------- metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return self._type.shape

    @property
    def dtype(self) -> dt.DType:
        return self._type.dtype

    @property
    def ndim(self) -> int:
        return self._type.ndim

    @property
    def device(self) -> Device:
        """Where the values live: cpu, or cuda:0 for a tensor in GPU memory (a traced tensor
        reports the cpu, where tracing runs)."""
        return device_of(self._data)

    @property
    def is_cuda(self) -> bool:
        return isinstance(self._data, DeviceBuffer)

    @property
    def is_traced(self) -> bool:
        return self._value is not None

    def dim(self) -> int:
        return self._type.ndim

    def numel(self) -> int:
        return self._type.numel

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = object.__hash__      # __eq__ is elementwise, identity hashing as in PyTorch

    # -------------------------------------------------------------- autograd
    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def detach(self) -> "Tensor":
        """The same values (shared, also while traced) with no autograd history."""
        if self._batch is not None:           # inside tc.vmap: the whole batch loses it too
            whole, level, batched = self._batch
            item = Tensor(None, self._type)
            item._batch = (whole.detach(), level, batched)
            return item
        return Tensor(self._data, self._type, self._value, self._trace)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not self.dtype.is_floating_point:
            raise DTypeError(f"only floating point tensors can require gradients, got {self.dtype.label}")
        if not requires_grad and self.grad_fn is not None:
            raise RuntimeError("requires_grad can only be turned off on leaf tensors; use detach()")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> None:
        """Keep `.grad` for this non-leaf tensor after backward (leaves always keep it)."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on a tensor that has requires_grad=False")
        if self.grad_fn is not None:
            self.grad_fn.retained[self._output_nr] = self
        self._retains_grad = True

    # backward(gradient=None, retain_graph=None, create_graph=False) is installed by
    # autograd/functional.py, where the engine lives.

    # -------------------------------------------------------------- concrete values
    def _concrete(self, why: str) -> np.ndarray:
        check_fresh(self)
        if self._batch is not None:
            raise add_location(VmapError(
                f"{why} needs the tensor's value, but inside tc.vmap a tensor stands for a whole "
                f"batch of values (each of shape {self.shape}, {self.dtype.label}): Python control "
                "flow and conversions cannot depend on one of them, and ops whose result shape "
                "depends on the values (nonzero, masked_select, unique) cannot be mapped. Use "
                "tc.where(...) for data-dependent selection, tc.cond and tc.while_loop for branches "
                "and loops, or move this code out of the mapped function."), str(user_location()))
        if self._data is None:
            raise add_location(TraceError(
                f"{why} needs the tensor's value, but inside tc.trace tensors are symbolic "
                f"(shape {self.shape}, {self.dtype.label}): Python control flow and conversions "
                "cannot depend on traced values. Use tc.where(...) for data-dependent selection, "
                "tc.cond(pred, true_fn, false_fn, *operands) for a branch, tc.while_loop or "
                "tc.fori_loop for a loop, or move this code outside the traced function."),
                str(user_location()))
        if isinstance(self._data, DeviceBuffer):     # item(), repr, bool(): a host copy, as PyTorch
            return self._data.to_host()
        return self._data

    def _host_array(self, why: str) -> np.ndarray:
        """The values as the NumPy array they are; a GPU tensor refuses, as in PyTorch."""
        if isinstance(self._data, DeviceBuffer):
            raise TypeError(f"{why}: can't convert {self.device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        return self._concrete(why)

    def numpy(self) -> np.ndarray:
        return self._host_array("Tensor.numpy()")

    def item(self):
        data = self._concrete("Tensor.item()")
        if data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return data.reshape(()).item()

    def tolist(self):
        return self._concrete("Tensor.tolist()").tolist()

    # cpu(), cuda() and to(device) move values between devices: bindings.py installs them
    # over runtime/devices.py's transfer (device memory is the runtime's).

    def __array__(self, dtype=None, copy=None):
        data = self._host_array("np.asarray(tensor)")
        return data if dtype is None else data.astype(dtype)

    def __dlpack__(self, *args, **kwargs):
        if isinstance(self._data, DeviceBuffer):
            check_fresh(self)
            return self._data.__dlpack__(*args, **kwargs)
        data = self._concrete("__dlpack__")
        if data.dtype == dt.BFLOAT16.np and "export" in host_dlpack:     # NumPy's DLPack lacks it
            return host_dlpack["export"](data)
        return data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__() if isinstance(self._data, DeviceBuffer) else (1, 0)   # kDLCPU

    # -------------------------------------------------------------- pickling and copying
    def __reduce_ex__(self, protocol):
        """Pickle the values, dtype, class and requires_grad, as PyTorch does: the autograd
        history (grad_fn) stays behind, so a tensor computed from a leaf arrives as a leaf
        that requires grad, and `.grad` is not sent.  A traced tensor has no values to send
        (TraceError)."""
        data = self._concrete("pickling a tensor")
        return _rebuild_tensor, (type(self), np.array(data), self._type, self.requires_grad,
                                 getattr(self, "__dict__", None))

    def __deepcopy__(self, memo: dict) -> "Tensor":
        """A copy with its own values and grad.  As in PyTorch, only leaves: a copy of a
        tensor computed from others could neither keep nor honestly drop its history."""
        if self.grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the "
                               f"deepcopy protocol at the moment; this one was computed by "
                               f"{type(self.grad_fn).__name__} (deepcopy its .detach() instead)")
        rebuild, args = self.__reduce_ex__(4)
        copy = memo[id(self)] = rebuild(*args)
        if self.grad is not None:
            import copy as copying
            copy.grad = copying.deepcopy(self.grad, memo)
        return copy

    def __bool__(self) -> bool:
        data = self._concrete("bool(tensor) (e.g. `if tensor:`)")
        if data.size != 1:
            raise ValueError(f"the truth value of a tensor with {data.size} elements is ambiguous")
        return bool(data.reshape(()))

    def __float__(self) -> float:
        return float(self._concrete("float(tensor)").reshape(()))

    def __int__(self) -> int:
        return int(self._concrete("int(tensor)").reshape(()))

    def __index__(self) -> int:
        data = self._concrete("using a tensor as an index")
        if data.dtype.kind not in "iu" or data.size != 1:
            raise TypeError("only integer tensors with one element can be converted to an index")
        return int(data.reshape(()))

    # -------------------------------------------------------------- printing
    def __repr__(self) -> str:
        extras = []
        if self.dtype not in (dt.FLOAT32, dt.INT64, dt.BOOL):
            extras.append(f"dtype={self.dtype!r}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        if self._batch is not None:
            what = f"batched: {self._batch[0].shape[0]} items" if self._batch[2] else "unbatched, in tc.vmap"
            return f"tensor(<{what}>, shape={self.shape}, dtype={self.dtype!r})"
        if self._data is None:
            return f"tensor(<traced>, shape={self.shape}, dtype={self.dtype!r})"
        if isinstance(self._data, DeviceBuffer):
            extras.insert(0, f"device='{self.device}'")
        tail = "".join(", " + e for e in extras)
        return f"tensor({format_array(self._concrete('repr'), prefix='tensor(')}{tail})"


def format_array(data: np.ndarray, prefix: str) -> str:
    """PyTorch's look: `1., 2.` for whole floats, 4 decimals otherwise."""
    if data.dtype.itemsize == 2 and dt.is_float_array_dtype(data.dtype):
        data = data.astype(np.float32)        # NumPy prints ml_dtypes' bfloat16 without precision
    if data.size and data.dtype.kind == "f":
        finite = data[np.isfinite(data)]
        whole = finite.size == 0 or np.all(finite == np.round(finite))
        mode = "maxprec_equal" if whole else "fixed"
        return np.array2string(data, separator=", ", prefix=prefix, precision=4, floatmode=mode)
    if data.dtype.kind == "b":
        return np.array2string(data, separator=", ", prefix=prefix,
                               formatter={"bool": lambda b: "True" if b else "False"})
    return np.array2string(data, separator=", ", prefix=prefix)


def foreign_name(x: Any) -> str:
    """`torch.Tensor` for a PyTorch tensor: the full name of an array type of another library."""
    t = type(x)
    return f"{t.__module__.split('.')[0]}.{t.__name__}"


def is_foreign(x: Any) -> bool:
    """An array of another library that shares its memory through DLPack (a torch.Tensor)."""
    return hasattr(x, "__dlpack__") and not isinstance(x, (Tensor, np.ndarray, np.generic, int, float, bool))


def from_dlpack(x: Any) -> Tensor:
    """The tracecomp Tensor sharing `x`'s memory (zero copy), for any DLPack exporter on the
    CPU: a torch.Tensor, a NumPy or JAX array.  A torch.Tensor that requires grad refuses:
    its gradient would be lost, so detach it first, as PyTorch asks before .numpy()."""
    if isinstance(x, Tensor):
        return x
    if getattr(x, "requires_grad", False):
        raise add_location(ArgumentError(
            f"a {foreign_name(x)} that requires grad cannot be shared with tracecomp (its gradient "
            f"would be lost): pass x.detach(), or compute the gradient with tracecomp"), str(user_location()))
    kind = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
    if kind in dlpack_importers:         # a GPU array: shared where it lives
        data = dlpack_importers[kind](x)
        return Tensor(data, TensorType(data.shape, dt.from_numpy(data.dtype)))
    try:
        return Tensor.from_numpy(np.from_dlpack(x))
    except (TypeError, RuntimeError, BufferError) as e:
        if "import" in host_dlpack:          # bfloat16, which NumPy's DLPack lacks
            try:
                return Tensor.from_numpy(host_dlpack["import"](x))
            except TracecompError as why:    # names the DLPack dtype where NumPy's message does not
                e = why
        raise ArgumentError(f"from_dlpack: cannot share the memory of a {foreign_name(x)} ({e}); "
                            "tracecomp takes CPU arrays") from None


def as_tensor(x: Any) -> Tensor:
    """A Tensor from a Tensor, NumPy array, DLPack/array-protocol object or Python scalar."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor.from_numpy(x)
    if is_foreign(x):
        return from_dlpack(x)
    if isinstance(x, np.generic):         # NumPy scalars keep their dtype, as in PyTorch
        return Tensor.from_numpy(np.asarray(x))
    if isinstance(x, (bool, int, float)):
        return Tensor.from_numpy(np.asarray(x, dtype=dt.scalar_dtype(x).np))
    return Tensor.from_numpy(np.asarray(x))


def _rebuild_tensor(cls: type, data: np.ndarray, type_: TensorType, requires_grad: bool,
                    state: dict | None = None) -> Tensor:
    """A pickled tensor back: a leaf of class `cls` (Tensor, Parameter, ...) holding `data`."""
    tensor = cls.__new__(cls)
    Tensor.__init__(tensor, data, type_, requires_grad=requires_grad)
    if state:
        tensor.__dict__.update(state)
    return tensor


def check_fresh(t) -> None:
    """Raise if t was indexed from a tensor that has changed in place since (or one of the
    tensors that one was indexed from: a loop, not a recursion, as the chain may be long)."""
    view = t._view_of
    while view is not None:
        base, index, version = view
        if base._version != version:
            raise ArgumentError(
                f"this tensor was taken from another by indexing ({_describe(index)}), which has been "
                "changed in place since; PyTorch's view would show the change, tracecomp's copy does "
                "not. Index the changed tensor again")
        view = base._view_of


def _describe(index) -> str:
    return "x[" + ", ".join(map(repr, index if isinstance(index, tuple) else (index,))) + "]"


# A closed-over tensor changed in place inside a trace gets its eager state back (the
# tracer's restore_lifted): the fields Tensor._take_over replaces, and the version.
def snapshot(t: Tensor) -> tuple:
    """What an in-place change inside a trace replaces on an eager tensor (Tensor._take_over)."""
    return (t._data, t._value, t._trace, t.grad_fn, t._output_nr, t.requires_grad, t._tangent, t._batch, t._version)


def restore(t: Tensor, state: tuple) -> None:
    (t._data, t._value, t._trace, t.grad_fn, t._output_nr, t.requires_grad, t._tangent, t._batch,
     t._version) = state
