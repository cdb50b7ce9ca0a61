"""Loop IDs: the `!llvm.loop` metadata through which a loop asks LLVM's loop passes for
something (no vectorizing, a full unroll), attached to the latch branch of a loop that
`llvm.emitter.counted_loop` emitted.

llvmlite.ir has no self-referencing metadata node, which a loop ID must be (its first
operand is itself, else LLVM ignores it): `_LoopID` prints one, `distinct`, per loop.
"""
from __future__ import annotations

from typing import Sequence

import llvmlite.ir as ir

_I32 = ir.IntType(32)


class _LoopID(ir.values.MDValue):
    """`distinct !{!self, hints...}`: a loop's ID node with its hint nodes."""

    def __init__(self, module: ir.Module, hints: Sequence[ir.values.MDValue]):
        super().__init__(module, list(hints), name=str(len(module.metadata)))

    def descr(self, buf) -> None:
        refs = [self.get_reference()] + [h.get_reference() for h in self.operands]
        buf += (f"distinct !{{ {', '.join(refs)} }}", "\n")

    # Loop IDs are distinct: never equal to (or deduplicated with) another node.
    def __eq__(self, other) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def leave_alone(module: ir.Module) -> list[ir.values.MDValue]:
    """Vectorizer width 1 and interleave count 1 (the pair it reads as "already
    vectorized"), and no unrolling."""
    return [module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.width"), ir.Constant(_I32, 1)]),
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"), ir.Constant(_I32, 1)]),
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])]


def unroll_full(module: ir.Module) -> list[ir.values.MDValue]:
    """Unroll completely (a constant trip count): honoured with the pipeline's own
    unrolling off (runtime/target.py)."""
    return [module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.full")])]


def attach(index: ir.PhiInstr, module: ir.Module, hints: Sequence[ir.values.MDValue]) -> None:
    """Give the loop whose induction phi is `index` an ID with `hints`, after counted_loop
    has closed it (its latch is the block of the phi's second incoming value)."""
    latch = index.incomings[-1][1]
    latch.terminator.set_metadata("llvm.loop", _LoopID(module, hints))
