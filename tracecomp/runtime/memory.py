"""Buffers for compiled code: 64-byte aligned allocation and workspace planning.

Outputs are fresh, 64-byte aligned arrays from NumPy's allocator, which requests
transparent huge pages for large arrays itself (np.core.multiarray._set_madvise_hugepage)
and, through malloc, reuses memory a previous call released: a fresh anonymous mmap per
call pays the first touch of every page again (BENCHMARKS.md, W2).  Large
outputs come from BlockCache, which recycles a block once no array references it.  Temporaries live in one workspace per compiled
function, kept across calls; temps whose lifetimes do not overlap share memory (greedy
best fit over the kernels' order), and no slot is reused while a live value still reads it.
"""
from __future__ import annotations

import ctypes
import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..symbolic import Dim, DynamicShapeError, hint

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


def is_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % ALIGN == 0


@dataclass
class Slot:
    nbytes: int
    free_after: int = -1      # index of the last kernel that reads the slot's current value


def plan_workspace(temps: dict[str, int], first: dict[str, int],
                   last: dict[str, int]) -> tuple[dict[str, int], list[int]]:
    """Assign each temp (name -> nbytes, live from kernel `first` to kernel `last`) a slot;
    two temps share a slot only if one dies before the other is written.
    Returns (temp -> slot index, slot sizes in bytes).
    Sizes may be symbolic (symbolic.Dim, in exported libraries with dynamic dims): a slot is
    reused or grown only where the comparison holds for every size, the choice among such
    slots follows the example sizes."""
    slots: list[Slot] = []
    assignment: dict[str, int] = {}
    for name in sorted(temps, key=lambda n: first[n]):
        need, start = temps[name], first[name]
        free = [i for i, s in enumerate(slots) if s.free_after < start]
        fitting = [i for i in free if _provably_ge(slots[i].nbytes, need)]
        growable = [i for i in free if _provably_ge(need, slots[i].nbytes)]
        if fitting:
            i = min(fitting, key=lambda i: hint(slots[i].nbytes))
        elif growable:
            i = max(growable, key=lambda i: hint(slots[i].nbytes))
            slots[i].nbytes = need
        else:
            slots.append(Slot(need))
            i = len(slots) - 1
        slots[i].free_after = last[name]
        assignment[name] = i
    return assignment, [s.nbytes for s in slots]


def _provably_ge(a, b) -> bool:
    try:
        return bool(a >= b)
    except DynamicShapeError:
        return False


def buffer_nbytes(buffer):
    """Bytes of a loop-IR buffer: an int, or a symbolic.Dim for dynamic dims."""
    if all(isinstance(d, int) for d in buffer.shape):
        return int(np.prod(buffer.shape, dtype=np.int64)) * buffer.dtype.itemsize
    from ..lower.loops.index import symbolic
    return math.prod(symbolic(d) for d in buffer.shape) * buffer.dtype.itemsize


def plan_program(program) -> tuple[dict[str, int], list[int]]:
    """The workspace plan of a scheduled Program: a temp lives from the first kernel that
    touches it to the last (random fills happen before kernel 0).
    Returns (temp -> slot index, slot sizes in bytes)."""
    temps = {n: b for n, b in program.buffers.items() if b.role == "temp"}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, k in enumerate(program.kernels):
        for b in k.buffers:
            if b.name in temps:
                first.setdefault(b.name, i)
                last[b.name] = i
    for f in program.fills:
        if f.buffer in temps:         # a random output is filled in its fresh output buffer
            first[f.buffer] = -1
            last.setdefault(f.buffer, -1)
    sizes = {n: buffer_nbytes(temps[n]) for n in first}
    return plan_workspace({n: s if isinstance(s, Dim) else max(1, s) for n, s in sizes.items()}, first, last)
