"""The workspace plan of a scheduled Program: which temps share memory, and how much.

A temp lives from the first kernel that touches it to the last (random fills happen before
kernel 0); temps whose lifetimes do not overlap share a slot (greedy best fit over the
kernels' order), and no slot is reused while a live value still reads it.  The runtime
(runtime/compiled.py) allocates the slots once per compiled function; an exported library
(llvm/entry_point.py) places them in a static block or allocates them per call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.symbolic import Dim, DynamicShapeError, hint


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
    from ..loops.index import symbolic
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
