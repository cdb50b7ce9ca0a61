"""CheckedIndex on the CPU and the GPU: the index clamped, its failures recorded cheaply.

Per function (a kernel, an outlined parallel range, an epilogue, a GPU launch) and per
check, the emitter keeps the largest index it met, compared as unsigned (so a negative
index is larger than any positive one), in a stack slot set to 0 at the function's entry.
LLVM promotes the slot to a register, so an index costs one unsigned max, a reduction the
loop vectorizer keeps in vector lanes; no branch enters the loop.  When the function
returns (`flush`), a check whose maximum is at least its size failed: its maximum goes to
the error buffer with atomic ops (unsigned max of the value, or of the flags), so threads
that fail at once leave the same record in any order (loops/ir.py).  A static size 0 has
no valid index: every index is recorded where it is met.
"""
from __future__ import annotations

import llvmlite.ir as ir

from . import scalar as S
from ..loops.ir import CheckedIndex


class IndexCheckSlots:
    """The running maxima of one function's index checks (see the module docstring)."""

    def __init__(self, em):
        self.em = em                   # the FunctionEmitter whose function this is
        self.slots: dict[tuple[str, int], tuple[ir.Value, object]] = {}   # (buffer, check) -> (slot, size)

    def index(self, e: CheckedIndex, env: dict[str, ir.Value]) -> ir.Value:
        """The index clamped into [0, size), its check's running maximum updated."""
        b = self.em.builder
        index = self.em.expr(e.index, env)
        zero = ir.Constant(S.I64, 0)
        if isinstance(e.size, int) and e.size == 0:
            self.record(e.buffer, e.check, index)
            return zero
        slot = self._slot(e)
        b.store(S.intrinsic(b, "umax", [b.load(slot, typ=S.I64), index]), slot)
        last = ir.Constant(S.I64, e.size - 1) if isinstance(e.size, int) else \
            b.sub(self.em.extent(e.size), ir.Constant(S.I64, 1))
        return S.intrinsic(b, "smin", [S.intrinsic(b, "smax", [index, zero]), last])

    def flush(self) -> None:
        """Record the checks whose maximum is out of range (a branch per check, after every loop)."""
        b = self.em.builder
        for (buffer, check), (slot, size) in self.slots.items():
            worst = b.load(slot, typ=S.I64)
            with b.if_then(b.icmp_unsigned(">=", worst, self.em.extent(size)), likely=False):
                self.record(buffer, check, worst)

    def record(self, buffer: str, check: int, value: ir.Value) -> None:
        """Atomically: the check's largest offending index (unsigned max), its flag, the record's flag."""
        b, ptr = self.em.builder, self.em.buffer_pointer(buffer)
        one = ir.Constant(S.I64, 1)
        for k, op, v in ((2 + 2 * check, "umax", value), (1 + 2 * check, "or", one), (0, "or", one)):
            at = b.gep(ptr, [ir.Constant(S.I64, k)], inbounds=True, source_etype=S.I64)
            b.atomic_rmw(op, at, v, "monotonic")

    def _slot(self, e: CheckedIndex) -> ir.Value:
        """The running maximum of check `e.check`: an i64 stack slot set to 0 at the
        function's entry, where it dominates every use."""
        key = (e.buffer, e.check)
        if key not in self.slots:
            b = self.em.builder
            here = b.block
            b.position_at_start(self.em.fn.entry_basic_block)
            slot = b.alloca(S.I64, name=f"check{e.check}.max")
            b.store(ir.Constant(S.I64, 0), slot)
            b.position_at_end(here)
            self.slots[key] = (slot, e.size)
        return self.slots[key][0]
