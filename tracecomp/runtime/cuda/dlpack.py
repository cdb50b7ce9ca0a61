"""DLPack interchange for memory NumPy cannot describe (CUDA device pointers).

NumPy's own DLPack support covers host memory only. This module has the legacy DLPack
C structs (DLDevice, DLDataType, DLTensor, DLManagedTensor, as in dmlc/dlpack's
include/dlpack/dlpack.h) over ctypes. With them, tracecomp can export a buffer it owns,
for example a device allocation from its pool (`to_capsule`), and read a producer's capsule
without copying, for example a PyTorch CUDA tensor (`from_capsule`, `from_object`).

Protocol, as the spec states it:
  * The capsule is named "dltensor". A consumer renames it "used_dltensor" and then
    has to call the DLManagedTensor's deleter when it is done.
  * If a capsule is destroyed while it is still named "dltensor", nobody consumed it,
    so its destructor calls the deleter itself.

Export ownership: each exported DLManagedTensor, its shape and strides arrays and the
caller's `owner` live in `_REGISTRY`, keyed by the struct's address, until the deleter
runs. The deleter is a ctypes callback. Any thread may call it, because ctypes takes the
GIL for the callback.

A limit of pure ctypes: a callback cannot hand back an exception that was already
pending when it was entered. This happens when CPython drops a temporary on a C error
path, for example `int(to_capsule(...))`. The callbacks still release what they hold. The
pending exception is then reported through sys.unraisablehook, and the interrupted call
raises SystemError in its place.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

import ml_dtypes  # noqa: F401  (names bfloat16 for NumPy: np.dtype("bfloat16"))
import numpy as np

from tracecomp.core.errors import ArgumentError, DTypeError

__all__ = ["to_capsule", "from_capsule", "from_object", "Imported",
           "DLDevice", "DLDataType", "DLTensor", "DLManagedTensor",
           "kDLCPU", "kDLCUDA"]

# ---------------------------------------------------------------- the ABI

kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 4, 5, 6

_CODE_NAMES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 3: "kDLOpaqueHandle", 4: "kDLBfloat",
               5: "kDLComplex", 6: "kDLBool", 7: "kDLFloat8_e3m4", 8: "kDLFloat8_e4m3",
               9: "kDLFloat8_e4m3b11fnuz", 10: "kDLFloat8_e4m3fn", 11: "kDLFloat8_e4m3fnuz",
               12: "kDLFloat8_e5m2", 13: "kDLFloat8_e5m2fnuz", 14: "kDLFloat8_e8m0fnu",
               15: "kDLFloat6_e2m3fn", 16: "kDLFloat6_e3m2fn", 17: "kDLFloat4_e2m1fn"}


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, c_void_p)     # void (*)(DLManagedTensor*), argument as an address
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", _Deleter)]

# Calls a producer's deleter with the GIL held: many deleters written for Python (Cython,
# C extensions) decref objects without taking the GIL themselves.
_CallDeleter = ctypes.PYFUNCTYPE(None, c_void_p)

# The capsule destructor takes the capsule as a raw address, not as py_object. The capsule
# is being deallocated (refcount 0), so a py_object argument would take a new reference,
# drop it again, and deallocate the capsule a second time (infinite recursion, crash).
_CapsuleDestructor = ctypes.CFUNCTYPE(None, c_void_p)


def _capi(name, restype, *argtypes):
    # Private prototypes: setting argtypes on ctypes.pythonapi's attributes would change
    # them for every other user in the process.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_PyCapsule_New = _capi("PyCapsule_New", ctypes.py_object, c_void_p, c_char_p, _CapsuleDestructor)
# Capsules are passed as addresses, so these also work on a capsule that is being destroyed.
_PyCapsule_IsValid = _capi("PyCapsule_IsValid", c_int, c_void_p, c_char_p)
_PyCapsule_GetPointer = _capi("PyCapsule_GetPointer", c_void_p, c_void_p, c_char_p)
_PyCapsule_GetName = _capi("PyCapsule_GetName", c_char_p, c_void_p)
_PyCapsule_SetName = _capi("PyCapsule_SetName", c_int, ctypes.py_object, c_char_p)
_PyErr_Occurred = _capi("PyErr_Occurred", c_void_p)
_Py_IncRef = _capi("Py_IncRef", None, ctypes.py_object)

# PyCapsule keeps the name pointer, not a copy, so these buffers must never be freed.
_NAME = ctypes.create_string_buffer(b"dltensor")
_USED_NAME = ctypes.create_string_buffer(b"used_dltensor")

# ---------------------------------------------------------------- dtypes

_FROM_DL = {(kDLInt, 8): "int8", (kDLInt, 16): "int16", (kDLInt, 32): "int32", (kDLInt, 64): "int64",
            (kDLUInt, 8): "uint8", (kDLUInt, 16): "uint16", (kDLUInt, 32): "uint32",
            (kDLUInt, 64): "uint64", (kDLFloat, 16): "float16", (kDLFloat, 32): "float32",
            (kDLFloat, 64): "float64", (kDLBool, 8): "bool", (kDLBfloat, 16): "bfloat16"}
_TO_DL = {np.dtype(v): k for k, v in _FROM_DL.items()}


def _describe_dl_dtype(code: int, bits: int, lanes: int) -> str:
    name = _CODE_NAMES.get(code, f"code {code}")
    common = {(kDLComplex, 64): "complex64", (kDLComplex, 128): "complex128",
              (kDLBfloat, 16): "bfloat16"}.get((code, bits))
    detail = f"{name}, code={code}, bits={bits}, lanes={lanes}"
    return f"{common} ({detail})" if common and lanes == 1 else detail


def _numpy_dtype(dt: DLDataType) -> np.dtype:
    code, bits, lanes = int(dt.code), int(dt.bits), int(dt.lanes)
    name = _FROM_DL.get((code, bits)) if lanes == 1 else None
    if name is None:
        raise DTypeError(f"DLPack dtype {_describe_dl_dtype(code, bits, lanes)} is not supported; "
                         "tracecomp imports int8-64, uint8-64, bfloat16, float16/32/64 and bool, one lane")
    return np.dtype(name)


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


# ---------------------------------------------------------------- export

_REGISTRY: dict = {}            # DLManagedTensor address -> (struct, dims array, owner)
_REGISTRY_LOCK = threading.Lock()


def _make_callbacks(registry, lock, is_valid, get_pointer, name, err_occurred):
    """The deleter and the capsule destructor, as closures over what they use. During
    interpreter shutdown, module globals are set to None, and a consumer may still free a
    tensor at that point."""

    def take_pending():
        # If an exception is already set, any pythonapi call raises it here. Catching it
        # stops it from breaking the calls below. Nothing can hand it back to the C caller.
        try:
            err_occurred()
        except BaseException as e:      # noqa: B036 - whatever the interrupted code raised
            return e
        return None

    def release(addr):
        with lock:
            entry = registry.pop(addr, None)
        # Dropped outside the lock: freeing the owner can run arbitrary code (a buffer's
        # __del__ returning memory to the pool), and that code may export again.
        del entry

    def deleter(addr):
        pending = take_pending()
        release(addr)
        if pending is not None:
            raise pending               # ctypes passes it to sys.unraisablehook

    def capsule_destructor(cap):
        pending = take_pending()
        if is_valid(cap, name):         # still "dltensor": never consumed, so the deleter is ours to call
            release(get_pointer(cap, name))
        if pending is not None:
            raise pending

    return _Deleter(deleter), _CapsuleDestructor(capsule_destructor)


_deleter, _capsule_destructor = _make_callbacks(
    _REGISTRY, _REGISTRY_LOCK, _PyCapsule_IsValid, _PyCapsule_GetPointer, _NAME, _PyErr_Occurred)
# Kept alive on purpose, past module teardown. A consumer that frees a tensor late still
# jumps into a live thunk, and still reads live shape/strides memory.
_IMMORTAL = (_deleter, _capsule_destructor, _REGISTRY, _REGISTRY_LOCK, _NAME, _USED_NAME)
_Py_IncRef(_IMMORTAL)


def to_capsule(ptr: int, shape, dtype, device, owner):
    """A "dltensor" capsule for the C-contiguous array of `shape` and `dtype` at address
    `ptr`, on `device` = (device_type, device_id), e.g. (kDLCUDA, 0). `owner` is kept alive
    until the consumer calls the deleter, or until the capsule is dropped without being
    consumed."""
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)) or ptr < 0:
        raise ArgumentError(f"to_capsule: ptr must be a non-negative int address, got {ptr!r}")
    try:
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise ArgumentError(f"to_capsule: shape must be a tuple of ints, got {shape!r}") from None
    if any(n < 0 for n in shape):
        raise ArgumentError(f"to_capsule: negative size in shape {shape}")
    try:
        dev_type, dev_id = (int(d) for d in device)
    except (TypeError, ValueError):
        raise ArgumentError(f"to_capsule: device must be (device_type, device_id), got {device!r}") from None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ArgumentError(f"to_capsule: {dtype!r} is not a dtype") from None
    if not dt.isnative or dt.newbyteorder("=") not in _TO_DL:
        raise DTypeError(f"to_capsule: dtype {dt} has no DLPack export here "
                         "(int8-64, uint8-64, bfloat16, float16/32/64, bool in native byte order)")
    code, bits = _TO_DL[dt.newbyteorder("=")]

    ndim = len(shape)
    # Shape then strides in one int64 block, with at least one element, so that a 0-d
    # tensor still gets valid non-NULL pointers.
    dims = (c_int64 * max(2 * ndim, 1))(*shape, *_contiguous_strides(shape))
    mt = DLManagedTensor()
    t = mt.dl_tensor
    t.data = int(ptr) or None
    t.device = DLDevice(dev_type, dev_id)
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, 1)
    base = ctypes.addressof(dims)
    t.shape = ctypes.cast(base, POINTER(c_int64))
    t.strides = ctypes.cast(base + 8 * ndim, POINTER(c_int64))
    t.byte_offset = 0
    mt.manager_ctx = None
    mt.deleter = _deleter
    addr = ctypes.addressof(mt)
    with _REGISTRY_LOCK:
        _REGISTRY[addr] = (mt, dims, owner)
    try:
        return _PyCapsule_New(addr, _NAME, _capsule_destructor)
    except BaseException:
        with _REGISTRY_LOCK:
            _REGISTRY.pop(addr, None)
        raise


# ---------------------------------------------------------------- import

class Imported:
    """A producer's tensor as read from a consumed DLPack capsule. The memory stays the
    producer's until `release()` (or garbage collection) calls its deleter."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "_pending", "__weakref__")

    def __init__(self, ptr, shape, strides, dtype, device, managed_addr):
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device
        self._pending = [managed_addr]      # list.pop is atomic: release runs once across threads

    @property
    def is_contiguous(self) -> bool:
        """C order. Strides of size-1 dims do not matter, and an empty tensor is contiguous."""
        if 0 in self.shape:
            return True
        step = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1:
                if s != step:
                    return False
                step *= n
        return True

    @property
    def released(self) -> bool:
        return not self._pending

    def release(self) -> None:
        """Call the producer's deleter. Only the first call does anything."""
        try:
            addr = self._pending.pop()
        except IndexError:
            return
        fn = DLManagedTensor.from_address(addr).deleter
        if fn:      # NULL is allowed: the producer had nothing to free
            _CallDeleter(ctypes.cast(fn, c_void_p).value)(addr)

    def __del__(self):
        try:
            self.release()
        except Exception:       # noqa: BLE001 - at gc a failing deleter must not stop collection
            pass

    def __repr__(self):
        state = " released" if self.released else ""
        return (f"<Imported ptr=0x{self.ptr:x} shape={self.shape} strides={self.strides} "
                f"dtype={self.dtype} device={self.device}{state}>")


def from_capsule(capsule) -> Imported:
    """Consume a "dltensor" capsule. The capsule is renamed "used_dltensor", and the returned
    Imported calls the producer's deleter. On an unsupported dtype the capsule is left
    unconsumed, so its own destructor frees it."""
    if type(capsule).__name__ != "PyCapsule":
        raise ArgumentError(f"from_capsule: expected a DLPack capsule, got {type(capsule).__name__}")
    cap_addr = id(capsule)
    if not _PyCapsule_IsValid(cap_addr, _NAME):
        name = _PyCapsule_GetName(cap_addr)
        if name == b"used_dltensor":
            raise ArgumentError("from_capsule: this DLPack capsule was already consumed "
                                "(named 'used_dltensor'); a capsule can be imported only once")
        raise ArgumentError(f"from_capsule: capsule named {name!r} is not a legacy DLPack "
                            "'dltensor' capsule")
    addr = _PyCapsule_GetPointer(cap_addr, _NAME)
    if not addr:
        raise ArgumentError("from_capsule: the DLPack capsule holds a NULL pointer")
    t = DLManagedTensor.from_address(addr).dl_tensor
    ndim = int(t.ndim)
    if ndim < 0:
        raise ArgumentError(f"from_capsule: DLTensor has ndim={ndim}")
    if ndim and not t.shape:
        raise ArgumentError("from_capsule: DLTensor has a NULL shape")
    dtype = _numpy_dtype(t.dtype)       # before renaming: a refused capsule stays the producer's
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = (tuple(int(t.strides[i]) for i in range(ndim)) if ndim and t.strides
               else _contiguous_strides(shape))
    ptr = (t.data or 0) + int(t.byte_offset)
    device = (int(t.device.device_type), int(t.device.device_id))
    if _PyCapsule_SetName(capsule, _USED_NAME) != 0:
        raise ArgumentError("from_capsule: could not mark the capsule used")
    return Imported(ptr, shape, strides, dtype, device, addr)


def from_object(x, stream=None) -> Imported:
    """Import any object with `__dlpack__`. For a CUDA producer, `stream` is the consumer's
    stream (1 = the legacy default stream), and the producer orders its work before it.
    For host memory, leave it None."""
    fn = getattr(x, "__dlpack__", None)
    if fn is None:
        raise ArgumentError(f"from_object: {type(x).__name__} has no __dlpack__")
    capsule = fn() if stream is None else fn(stream=stream)
    return from_capsule(capsule)
