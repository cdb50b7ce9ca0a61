"""Buffers for compiled code: 64-byte aligned allocation and workspace planning.

Outputs are fresh, 64-byte aligned arrays from NumPy's allocator, which requests
transparent huge pages for large arrays itself (np.core.multiarray._set_madvise_hugepage)
and, through malloc, reuses memory a previous call released: a fresh anonymous mmap per
call measured 100-170 ms to first-touch 64 MiB on this VM (BENCHMARKS.md, W2).  Temporaries live in one workspace per compiled
function, kept across calls; temps whose lifetimes do not overlap share memory (greedy
best fit over the kernels' order), and no slot is reused while a live value still reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALIGN = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


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
    Returns (temp -> slot index, slot sizes in bytes)."""
    slots: list[Slot] = []
    assignment: dict[str, int] = {}
    for name in sorted(temps, key=lambda n: first[n]):
        need, start = temps[name], first[name]
        free = [i for i, s in enumerate(slots) if s.free_after < start]
        fitting = [i for i in free if slots[i].nbytes >= need]
        if fitting:
            i = min(fitting, key=lambda i: slots[i].nbytes)
        elif free:
            i = max(free, key=lambda i: slots[i].nbytes)
            slots[i].nbytes = need
        else:
            slots.append(Slot(need))
            i = len(slots) - 1
        slots[i].free_after = last[name]
        assignment[name] = i
    return assignment, [s.nbytes for s in slots]


def buffer_nbytes(buffer) -> int:
    return int(np.prod(buffer.shape, dtype=np.int64)) * buffer.dtype.itemsize


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
        first[f.buffer] = -1
        last.setdefault(f.buffer, -1)
    return plan_workspace({n: max(1, buffer_nbytes(temps[n])) for n in first}, first, last)
