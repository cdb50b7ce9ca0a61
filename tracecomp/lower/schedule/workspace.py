"""The workspace plan of a scheduled Program: which temps share memory, and how much.

A temp lives from the first kernel that touches it to the last (random fills happen before
kernel 0); temps whose lifetimes do not overlap share a slot (greedy best fit over the
kernels' order), and no slot is reused while a live value still reads it.  The runtime
(runtime/compiled.py) allocates the slots once per compiled function; an exported library
(llvm/entry_point.py) places them in a static block or allocates them per call.

With loops and branches (Program.steps, loops/control.py) lifetimes are positions in a
walk of the steps: each kernel call is one position, and a control step takes one
position before and one after its blocks, at both of which it touches the outer buffers
it uses (operands, results, carries' spares), so those stay live across every iteration.
A block's temps live within one iteration (a region is isolated from above: nothing but
the carries, which are outer buffers, passes from one iteration to the next), so two of
them that do not overlap in the walk may share a slot; a while loop's predicate is touched
once more where the runner reads it.  Bound buffers own no memory and are not planned.
"""
from __future__ import annotations

import bisect
import heapq
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
    if all(type(n) is int for n in temps.values()):
        return _plan_static(temps, first, last)
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


def _plan_static(temps: dict[str, int], first: dict[str, int],
                 last: dict[str, int]) -> tuple[dict[str, int], list[int]]:
    """plan_workspace's choices for int sizes, without a scan of every slot per temp (an
    unrolled loop keeps thousands of temps alive at once): the free slots are kept sorted
    by (size, index), the busy ones in a heap by the last kernel that reads them."""
    sizes: list[int] = []
    busy: list[tuple[int, int]] = []          # (free_after, slot)
    free: list[tuple[int, int]] = []          # (nbytes, slot), sorted
    assignment: dict[str, int] = {}
    for name in sorted(temps, key=lambda n: first[n]):
        need, start = temps[name], first[name]
        while busy and busy[0][0] < start:
            i = heapq.heappop(busy)[1]
            bisect.insort(free, (sizes[i], i))
        k = bisect.bisect_left(free, (need, -1))
        if k < len(free):                     # the smallest that fits (the first of equals)
            i = free.pop(k)[1]
        elif free:                            # else grow the largest (the first of equals)
            i = free.pop(bisect.bisect_left(free, (free[-1][0], -1)))[1]
            sizes[i] = need
        else:
            sizes.append(need)
            i = len(sizes) - 1
        heapq.heappush(busy, (last[name], i))
        assignment[name] = i
    return assignment, sizes


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
    if program.steps is None:
        for i, k in enumerate(program.kernels):
            for b in k.buffers:
                if b.name in temps:
                    first.setdefault(b.name, i)
                    last[b.name] = i
    else:
        _step_lifetimes(program, temps, first, last)
    for f in program.fills:
        if f.buffer in temps:         # a random output is filled in its fresh output buffer
            first[f.buffer] = -1
            last.setdefault(f.buffer, -1)
    sizes = {n: buffer_nbytes(temps[n]) for n in first}
    return plan_workspace({n: s if isinstance(s, Dim) else max(1, s) for n, s in sizes.items()}, first, last)


def _step_lifetimes(program, temps, first: dict, last: dict) -> None:
    """First and last positions of the temps in a walk of `program.steps` (module docstring)."""
    from ..loops import control as C
    kernels = {k.name: k for k in program.kernels}
    position = 0

    def touch(names) -> None:
        nonlocal position
        for n in names:
            if n in temps:
                first.setdefault(n, position)
                last[n] = position
        position += 1

    def walk(steps) -> None:
        for s in steps:
            if isinstance(s, C.Run):
                touch(b.name for b in kernels[s.kernel].buffers)
                continue
            outer = C.outer_buffers(s)
            touch(outer)
            for j, block in enumerate(C.blocks(s)):
                walk(block.steps)
                if isinstance(s, C.While) and j == 0:
                    touch(block.outputs)          # the runner reads the predicate
            touch(outer)
    walk(program.steps)
