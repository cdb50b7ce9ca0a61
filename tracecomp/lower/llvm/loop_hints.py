"""Loops that LLVM should leave as written: no vectorizing, interleaving or unrolling.

`plain_loop(b, start, stop, name)` is `llvm.codegen.counted_loop` whose latch branch
carries `!llvm.loop` metadata asking the loop vectorizer for width 1 and interleave count
1 (the pair it reads as "already vectorized") and the unroller for nothing.  It is for
loops that are already vectorized by hand (the matmul's packing) or that run on edges
only (partial panels and tiles): left to LLVM, each such loop came back as a vector loop,
a vector epilogue, runtime checks and unrolled remainders, and the matmul's two packing
functions were a large part of a module's LLVM time while their hot paths gained nothing.

llvmlite.ir has no self-referencing metadata node, which a loop ID must be (its first
operand is itself, else LLVM ignores it): `_LoopID` prints one, `distinct`, per loop.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import llvmlite.ir as ir

from .emitter import LoopState, counted_loop

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


def _leave_alone_hints(module: ir.Module) -> list[ir.values.MDValue]:
    return [module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.width"), ir.Constant(_I32, 1)]),
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"), ir.Constant(_I32, 1)]),
            module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])]


def mark_left_alone(state: LoopState, module: ir.Module) -> None:
    """Attach the hints to the loop of `state`, after counted_loop has closed it (its latch
    is the block of the index phi's second incoming value)."""
    latch = state.index.incomings[-1][1]
    latch.terminator.set_metadata("llvm.loop", _LoopID(module, _leave_alone_hints(module)))


@contextlib.contextmanager
def plain_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, name: str,
               carried: Sequence[ir.Value] = ()) -> Iterator[LoopState]:
    """counted_loop (same arguments and state) that LLVM neither vectorizes nor unrolls."""
    with counted_loop(b, start, stop, name, carried) as state:
        yield state
    mark_left_alone(state, b.module)
