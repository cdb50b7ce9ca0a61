"""Device memory: the context tracecomp runs on, a pool of blocks, and DeviceArray.

`context()` is the CUDA device's primary context, or with TRACECOMP_CUDA_EMULATOR=1 the
host emulator (emulator.py), so that everything above this module, device tensors
included, runs and is tested without a GPU.

Every block comes from the context's Pool: a freed DeviceArray's block goes back to a free
list of its size class and the next array of that class takes it, as the CPU backend's
output-block cache does, so a training loop stops calling cuMemAlloc after its first step.
All work runs in order on the device's default stream, which is why a block can be reused
as soon as its array is gone: the launches that still read it were queued before any launch
that could write it again.  The host waits only where it reads values (`to_host`).
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Optional

import numpy as np

from ...core.devices import CUDA, DeviceBuffer, dlpack_importers
from ...core.errors import ArgumentError
from . import driver

EMULATOR_ENV = "TRACECOMP_CUDA_EMULATOR"
_SMALL = 1 << 20           # below this, sizes round up to 512 bytes; above, to 2 MiB
_lock = threading.Lock()
_contexts: dict[bool, Any] = {}


def emulated() -> bool:
    return os.environ.get(EMULATOR_ENV, "") not in ("", "0")


def context():
    """The context device work runs on (one per process and kind, made on first use):
    CudaUnavailableError without a driver or GPU, unless the emulator is asked for."""
    kind = emulated()
    with _lock:
        if kind not in _contexts:
            if kind:
                from .emulator import EmulatedContext
                _contexts[kind] = EmulatedContext()
            else:
                _contexts[kind] = driver.driver().context(0)
        return _contexts[kind]


def available() -> bool:
    """Whether device tensors can be made here (a GPU, or the emulator asked for)."""
    return emulated() or driver.available()


def size_class(nbytes: int) -> int:
    step = 512 if nbytes < _SMALL else 2 << 20
    return max(step, -(-int(nbytes) // step) * step)


class Pool:
    """Free blocks of one context by size class."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.free: dict[int, list[int]] = {}
        self.lock = threading.Lock()
        self.held = 0              # bytes in live arrays
        self.cached = 0            # bytes in free blocks

    def take(self, nbytes: int) -> tuple[int, int]:
        """(pointer, size class) of a block of at least `nbytes`."""
        cls = size_class(nbytes)
        with self.lock:
            blocks = self.free.get(cls)
            if blocks:
                self.cached -= cls
                self.held += cls
                return blocks.pop(), cls
        try:
            ptr = self.ctx.alloc(cls)
        except driver.CudaError:
            self.empty()           # out of memory: give the cached blocks back and try once more
            ptr = self.ctx.alloc(cls)
        with self.lock:
            self.held += cls
        return ptr, cls

    def give(self, ptr: int, cls: int) -> None:
        with self.lock:
            self.free.setdefault(cls, []).append(ptr)
            self.held -= cls
            self.cached += cls

    def empty(self) -> None:
        """Free every cached block (PyTorch's torch.cuda.empty_cache)."""
        with self.lock:
            blocks = [p for ps in self.free.values() for p in ps]
            self.free.clear()
            self.cached = 0
        for p in blocks:
            self.ctx.free(p)


_pools: dict[int, Pool] = {}


def pool(ctx=None) -> Pool:
    ctx = ctx if ctx is not None else context()
    with _lock:
        p = _pools.get(id(ctx))
        if p is None:
            p = _pools[id(ctx)] = Pool(ctx)
        return p


class DeviceArray(DeviceBuffer):
    """A C-contiguous array in device memory: a pool block, or memory another library owns
    (DLPack), kept alive by `owner` until this array goes."""

    def __init__(self, shape, dtype, *, ptr: Optional[int] = None, owner: Any = None, ctx=None):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ctx = ctx if ctx is not None else context()
        if ptr is None:
            block_pool = pool(self.ctx)
            self.ptr, cls = block_pool.take(self.nbytes)
            weakref.finalize(self, block_pool.give, self.ptr, cls)
        else:
            self.ptr, self.owner = int(ptr), owner
            if owner is not None and hasattr(owner, "release"):
                weakref.finalize(self, owner.release)

    device = CUDA

    @classmethod
    def from_host(cls, array: np.ndarray, ctx=None) -> "DeviceArray":
        a = np.asarray(array)
        if not a.flags.c_contiguous:      # (np.ascontiguousarray would make a 0-d array 1-d)
            a = np.ascontiguousarray(a)
        out = cls(a.shape, a.dtype, ctx=ctx)
        out.ctx.to_device(out.ptr, a)
        return out

    def to_host(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        # a synchronous copy on the default stream: it waits for the launches that write it
        return self.ctx.to_host(out, self.ptr) if self.nbytes else out

    def copy(self) -> "DeviceArray":
        out = DeviceArray(self.shape, self.dtype, ctx=self.ctx)
        self.ctx.copy(out.ptr, self.ptr, self.nbytes)
        return out

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"

    # ---------------------------------------------------------------- DLPack
    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)          # kDLCUDA, device 0

    def __dlpack__(self, *, stream: Any = None, max_version=None, dl_device=None, copy=None):
        from . import dlpack
        if dl_device is not None and tuple(dl_device) != (2, 0):
            raise ArgumentError(f"a CUDA tensor cannot be exported to DLPack device {dl_device} "
                                "without a copy (use .cpu())")
        if stream not in (None, 1):
            # the consumer reads on a stream of its own: our work on the default stream
            # must be finished first
            self.ctx.synchronize()
        return dlpack.to_capsule(self.ptr, self.shape, self.dtype, (2, 0), owner=self)


def from_dlpack(x: Any) -> DeviceArray:
    """A DeviceArray over a CUDA array of another library (a torch CUDA tensor), zero copy:
    its memory stays the producer's, kept alive until the DeviceArray goes.  A layout the
    compiled code cannot take (strides of a transposed view) is made contiguous once, by the
    producer where it can (torch's .contiguous())."""
    from . import dlpack
    imported = dlpack.from_object(x, stream=1)
    if not imported.is_contiguous:
        imported.release()
        if not hasattr(x, "contiguous"):
            raise ArgumentError(f"a non-contiguous {type(x).__name__} on the GPU cannot be taken "
                                "without a copy; make it contiguous first")
        logging.getLogger("tracecomp").info("from_dlpack: a %s with strides %s made contiguous once",
                                            type(x).__name__, imported.strides)
        imported = dlpack.from_object(x.contiguous(), stream=1)
    if imported.device[0] != 2:
        imported.release()
        raise ArgumentError(f"from_dlpack: the array is on DLPack device {imported.device}, not CUDA")
    return DeviceArray(imported.shape, imported.dtype, ptr=imported.ptr, owner=imported)


dlpack_importers[2] = from_dlpack       # kDLCUDA
