"""Buffers for compiled code: 64-byte aligned allocation and recycled output blocks.

Outputs are fresh, 64-byte aligned arrays from NumPy's allocator, which requests
transparent huge pages for large arrays itself (np.core.multiarray._set_madvise_hugepage)
and, through malloc, reuses memory a previous call released: a fresh anonymous mmap per
call pays the first touch of every page again (BENCHMARKS.md, W2).  Large
outputs come from BlockCache, which recycles a block once no array references it.
Temporaries live in one workspace per compiled function, kept across calls, laid out by
lower/schedule/workspace.py's plan.
"""
from __future__ import annotations

import ctypes
import math
import threading
import weakref

import numpy as np


ALIGN = 64


def _data_offset() -> int | None:
    """Where CPython keeps an ndarray's data pointer, relative to the object's address: right
    after the object header (NumPy's PyArrayObject_fields starts `PyObject_HEAD; char *data`).
    Probed on live arrays; None (use the slower `.ctypes.data`) if the probe disagrees."""
    offset = object.__basicsize__
    probes = [np.empty(5), np.arange(10, dtype=np.int32)[3:], np.zeros((2, 3), np.float32).T]
    try:
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data for a in probes):
            return offset
    except (OSError, ValueError):
        pass
    return None


_DATA_OFFSET = _data_offset()
_pointer_at = ctypes.c_void_p.from_address


def data_pointer(a: np.ndarray) -> int:
    """The address of `a`'s first element (an exact ndarray): `a.ctypes.data`, read straight from
    the array object when the layout probe passed (0.2 us instead of 0.8 us per array)."""
    if _DATA_OFFSET is None:
        return a.ctypes.data
    return _pointer_at(id(a) + _DATA_OFFSET).value or 0


def aligned_empty_at(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, int]:
    """A fresh 64-byte aligned array and the address of its data."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    base = data_pointer(raw)
    start = -base % ALIGN
    return np.ndarray(shape, dtype, raw, start), base + start     # a view of raw (one call)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return aligned_empty_at(shape, dtype)[0]


class BlockCache:
    """Large output buffers recycled once nothing references them any more.

    A fresh 64 MiB output costs its first touch on every call (page faults and zeroing, a
    fifth of W1's time, and a spread of 2x in softmax's, depending on whether the pages
    come as huge pages; BENCHMARKS.md, "Figures that were in the code"), because malloc hands such sizes back to the kernel when they are
    freed.  Here a block of at least MIN_BYTES is handed out through a ctypes window that
    owns nothing: the arrays built on it (and every view of them) keep the window alive,
    and when the last one dies a finalizer puts the block back, already faulted in, for
    the next output of that size.  So memory is reused only after the caller dropped every
    reference to it, as malloc would; at most `limit` bytes of free blocks are kept."""

    MIN_BYTES = 4 << 20

    def __init__(self, limit: int = 512 << 20):
        self.limit = limit
        self.free: dict[int, list[np.ndarray]] = {}
        self.free_bytes = 0
        self.lock = threading.Lock()

    def empty_at(self, shape: tuple[int, ...], dtype: np.dtype, raw_bytes: int) -> tuple[np.ndarray, int]:
        """A 64-byte aligned array of `raw_bytes` - ALIGN bytes and its data address."""
        with self.lock:
            blocks = self.free.get(raw_bytes)
            raw = blocks.pop() if blocks else None
            if raw is not None:
                self.free_bytes -= raw_bytes
        if raw is None:
            raw = np.empty(raw_bytes, np.uint8)
        base = data_pointer(raw)
        start = -base % ALIGN
        window = (ctypes.c_char * (raw_bytes - ALIGN)).from_buffer(raw, start)
        weakref.finalize(window, self._give_back, raw)
        return np.ndarray(shape, dtype, window), base + start

    def _give_back(self, raw: np.ndarray) -> None:
        with self.lock:
            if self.free_bytes + raw.nbytes <= self.limit:
                self.free.setdefault(raw.nbytes, []).append(raw)
                self.free_bytes += raw.nbytes

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.free_bytes = 0


output_blocks = BlockCache()


# Outputs below this many bytes (with ALIGN's slack) are NumPy's own allocation: aligning
# one cost 0.4 us (0.79 against 0.36 us), a quarter of a small call, while the compiled
# code assumes no alignment and a few unaligned vector stores cost nothing measurable.
SMALL_BYTES = 1024


def output_empty_at(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, int]:
    """A compiled program's fresh output and its address: a large one from `output_blocks`
    (recycled, already faulted in), a small one as NumPy allocates it, others from
    aligned_empty_at."""
    raw_bytes = math.prod(shape) * dtype.itemsize + ALIGN
    if raw_bytes >= BlockCache.MIN_BYTES:
        return output_blocks.empty_at(shape, dtype, raw_bytes)
    if raw_bytes < SMALL_BYTES:
        out = np.empty(shape, dtype)
        return out, data_pointer(out)
    return aligned_empty_at(shape, dtype)


def is_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % ALIGN == 0


