"""Loops that LLVM should leave as written: no vectorizing, interleaving or unrolling.

`plain_loop(b, start, stop, name)` is `llvm.codegen.counted_loop` whose latch branch
carries `!llvm.loop` metadata (loop_ids.py) asking the loop vectorizer for width 1 and
interleave count 1 (the pair it reads as "already vectorized") and the unroller for
nothing.  It is for loops that are already vectorized by hand (the matmul's packing) or
that run on edges only (partial panels and tiles): left to LLVM, each such loop came back
as a vector loop, a vector epilogue, runtime checks and unrolled remainders, and the
matmul's two packing functions were a large part of a module's LLVM time while their hot
paths gained nothing.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import llvmlite.ir as ir

from . import loop_ids
from .emitter import LoopState, counted_loop


def mark_left_alone(state: LoopState, module: ir.Module) -> None:
    """Attach the hints to the loop of `state`, after counted_loop has closed it."""
    loop_ids.attach(state.index, module, loop_ids.leave_alone(module))


@contextlib.contextmanager
def plain_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, name: str,
               carried: Sequence[ir.Value] = ()) -> Iterator[LoopState]:
    """counted_loop (same arguments and state) that LLVM neither vectorizes nor unrolls."""
    with counted_loop(b, start, stop, name, carried) as state:
        yield state
    mark_left_alone(state, b.module)
