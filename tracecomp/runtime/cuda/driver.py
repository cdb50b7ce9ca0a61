"""The CUDA driver API (libcuda.so.1) over ctypes: the few calls tracecomp needs.

Every call's CUresult is checked: a failure raises CudaError naming the call, the
result's name and the driver's description (`cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY
(out of memory)`).  Without a driver library, or when cuInit finds no device, `driver()`
raises CudaUnavailableError (one clear message, never a crash); the result is cached, so
later calls fail the same way quickly.

Objects: Driver (the library, initialized) -> Context (a device's primary context, made
current on the calling thread before each use) -> Module (PTX loaded by the driver's JIT)
-> its functions, launched with `Context.launch`.  Device memory is plain integers
(CUdeviceptr) from `Context.alloc`, freed with `Context.free`.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Optional, Sequence

import numpy as np

from ...core.errors import BackendError

LIBRARY = "libcuda.so.1"
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
CUDA_ERROR_NO_DEVICE = 100
_LOG_BYTES = 16384


class CudaError(BackendError):
    """A CUDA driver call failed."""

    def __init__(self, message: str, call: str = "", code: int = 0):
        super().__init__(message)
        self.call, self.code = call, code


class CudaUnavailableError(CudaError):
    """No CUDA driver or no CUDA device on this machine."""


class Driver:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.lock = threading.Lock()
        self.contexts: dict[int, Context] = {}
        self.check("cuInit", lib.cuInit(0))

    def error_text(self, code: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        return (f"{(name.value or b'CUDA_ERROR_%d' % code).decode()} "
                f"({(text.value or b'unknown error').decode()})")

    def check(self, call: str, code: int, extra: str = "") -> None:
        if code != 0:
            raise CudaError(f"{call} failed: {self.error_text(code)}{extra}", call, code)

    def call(self, name: str, *args) -> None:
        self.check(name, getattr(self.lib, name)(*args))

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def context(self, ordinal: int = 0) -> "Context":
        """The device's primary context, retained once per process and shared."""
        with self.lock:
            if ordinal not in self.contexts:
                self.contexts[ordinal] = Context(self, ordinal)
            return self.contexts[ordinal]


class Module:
    def __init__(self, ctx: "Context", handle: ctypes.c_void_p):
        self.ctx, self.handle = ctx, handle
        self.functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            fn = ctypes.c_void_p()
            self.ctx.driver.call("cuModuleGetFunction", ctypes.byref(fn), self.handle, name.encode())
            self.functions[name] = fn
        return self.functions[name]

    def unload(self) -> None:
        if self.handle:
            self.ctx.make_current()
            self.ctx.driver.call("cuModuleUnload", self.handle)
            self.handle = None


class Context:
    """A device's primary context (shared with other CUDA users of the process)."""

    def __init__(self, driver: Driver, ordinal: int):
        self.driver = driver
        count = driver.device_count()
        if not 0 <= ordinal < count:
            raise CudaError(f"CUDA device {ordinal} does not exist ({count} device(s))", "cuDeviceGet")
        self.device = ctypes.c_int()
        driver.call("cuDeviceGet", ctypes.byref(self.device), ordinal)
        self.handle = ctypes.c_void_p()
        driver.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.handle), self.device)
        self.make_current()

    def make_current(self) -> None:
        self.driver.call("cuCtxSetCurrent", self.handle)

    def attribute(self, attr: int) -> int:
        v = ctypes.c_int()
        self.driver.call("cuDeviceGetAttribute", ctypes.byref(v), attr, self.device)
        return v.value

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))

    @property
    def name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.driver.call("cuDeviceGetName", buf, 256, self.device)
        return buf.value.decode()

    def load(self, gpu) -> Module:
        """Load a program.GpuModule's PTX."""
        return self.load_ptx(gpu.ptx)

    def load_ptx(self, ptx: str) -> Module:
        """Load PTX through the driver's JIT; a rejected module raises with the JIT's log."""
        self.make_current()
        log = ctypes.create_string_buffer(_LOG_BYTES)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p).value, _LOG_BYTES)
        handle = ctypes.c_void_p()
        code = self.driver.lib.cuModuleLoadDataEx(ctypes.byref(handle), ctypes.c_char_p(ptx.encode() + b"\0"),
                                                  2, options, values)
        text = log.value.decode(errors="replace").strip()
        self.driver.check("cuModuleLoadDataEx", code, f"\n{text}" if text else "")
        return Module(self, handle)

    def alloc(self, nbytes: int) -> int:
        self.make_current()
        ptr = ctypes.c_uint64()
        self.driver.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(max(int(nbytes), 1)))
        return ptr.value

    def free(self, ptr: int) -> None:
        self.make_current()
        self.driver.call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def to_device(self, ptr: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        if a.nbytes:
            self.driver.call("cuMemcpyHtoD_v2", ctypes.c_uint64(ptr), ctypes.c_void_p(a.ctypes.data),
                             ctypes.c_size_t(a.nbytes))

    def to_host(self, array: np.ndarray, ptr: int) -> np.ndarray:
        if not array.flags.c_contiguous:
            raise BackendError("to_host needs a C-contiguous array")
        if array.nbytes:
            self.driver.call("cuMemcpyDtoH_v2", ctypes.c_void_p(array.ctypes.data), ctypes.c_uint64(ptr),
                             ctypes.c_size_t(array.nbytes))
        return array

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device to device, ordered after the launches before it on the default stream."""
        if nbytes:
            self.driver.call("cuMemcpyDtoD_v2", ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(nbytes))

    def launch(self, fn: ctypes.c_void_p, grid: Sequence[int], block: Sequence[int],
               args: Sequence[ctypes._SimpleCData], shared_bytes: int = 0) -> None:
        """cuLaunchKernel on the default stream; `args` are ctypes values in parameter order."""
        params = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        self.driver.call("cuLaunchKernel", fn, *(ctypes.c_uint(int(g)) for g in grid),
                         *(ctypes.c_uint(int(b)) for b in block), ctypes.c_uint(shared_bytes),
                         None, params, None)

    def synchronize(self) -> None:
        self.make_current()
        self.driver.call("cuCtxSynchronize")


@functools.lru_cache(maxsize=1)
def _load(library: str) -> tuple[Optional[Driver], Optional[str]]:
    try:
        lib = ctypes.CDLL(library)
    except OSError as e:
        return None, (f"CUDA is not available: the NVIDIA driver library {library} could not be "
                      f"loaded ({e}); device='cuda' needs an NVIDIA GPU and its driver")
    try:
        return Driver(lib), None
    except CudaError as e:
        hint = " (no CUDA-capable GPU is visible)" if e.code == CUDA_ERROR_NO_DEVICE else ""
        return None, f"CUDA is not available: {e}{hint}"


def driver(library: str = LIBRARY) -> Driver:
    """The initialized driver; CudaUnavailableError when there is no driver or no device."""
    drv, why = _load(library)
    if drv is None:
        raise CudaUnavailableError(why, "cuInit")
    return drv


def available() -> bool:
    try:
        return driver().device_count() > 0
    except CudaError:
        return False
