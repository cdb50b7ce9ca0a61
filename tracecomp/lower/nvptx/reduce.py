"""Reductions shared by the threads of a block, and split over several blocks.

Two kinds of Reduce can be shared (shareable.cooperative): monoids (`acc = acc fn term`, fn
associative and commutative) and first-extreme searches (argmax/argmin and max/min.dim:
shareable.arg_update).  A block computes one as:
  1. thread t folds terms t, t + T, t + 2T, ... into a partial (T threads; consecutive
     threads read consecutive terms: coalesced), starting from fn's identity (monoids) or
     the accumulators' initial values (searches);
  2. the 32 lanes of each warp merge their partials with butterfly shuffles
     (`llvm.nvvm.shfl.sync.bfly`), so every lane holds its warp's result;
  3. lane 0 of each warp writes that to shared memory; after a barrier every thread
     merges the warp results in warp order (a fixed order: the result is deterministic);
     a second barrier keeps the shared slots alive until all threads have read them;
  4. a monoid's initial value is combined in once, so the result is the Reduce's.
Merging two monoid partials applies fn; merging two search partials feeds the one with
the later index into the earlier one through the Reduce's own `take` condition, so ties
keep the first index and a NaN wins once, as in the serial loop.
For few long rows (launch.py: partials/finish) step 1 runs over one chunk of a row per
block and thread 0 writes the block's partials to a workspace; the finish launch merges
a row's chunk partials the same way and then runs the rest of the row's body.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from ..llvm import scalar as S
from ..loops.ir import Loop, Reduce
from . import intrinsics as X
from ..llvm.emitter import monoid_updates
from .launch import perfect_nest
from .shareable import arg_update
from .codegen import GpuEmitter, strided_loop


def identity(fn: str, dtype) -> ir.Constant:
    """The neutral element of `fn` on `dtype` (-0.0 for float sums keeps -0.0 results)."""
    k = S.kind(dtype)
    if k == "b":
        return ir.Constant(S.I1, int(fn in ("mul", "minimum", "and")))
    if k == "f":
        value = {"add": -0.0, "mul": 1.0, "maximum": -math.inf, "minimum": math.inf}[fn]
        return S.constant(value, dtype)
    bits = S.register_type(dtype).width
    value = {"add": 0, "mul": 1, "maximum": -(1 << (bits - 1)), "minimum": (1 << (bits - 1)) - 1}[fn]
    return S.constant(value, dtype)


def _memory(t: ir.Type) -> ir.Type:
    return S.I8 if t == S.I1 else t


class Combiner:
    """How the partial accumulators of one shareable Reduce start, fold and merge."""

    def __init__(self, em: GpuEmitter, s: Reduce, env: dict):
        self.em, self.s, self.env = em, s, env
        self.monoids = monoid_updates(s)
        self.arg = None if self.monoids is not None else arg_update(s)

    def starts(self) -> list[ir.Value]:
        if self.monoids is not None:
            return [identity(fn, a.dtype) for (fn, _), a in zip(self.monoids, self.s.accumulators)]
        self.em.forget_values()
        return [self.em.expr(a.init, self.env) for a in self.s.accumulators]

    def fold(self, carried: list[ir.Value], inner: dict) -> list[ir.Value]:
        """The accumulators after one more term (the body's Lets are bound in `inner`)."""
        em, s = self.em, self.s
        em.forget_values()
        if self.monoids is not None:
            return [S.binary(em.builder, fn, acc, em.expr(term, inner), a.dtype)
                    for (fn, term), acc, a in zip(self.monoids, carried, s.accumulators)]
        inner = {**inner, **{a.name: v for a, v in zip(s.accumulators, carried)}}
        return [em.expr(u, inner) for u in s.update]

    def merge(self, mine: list[ir.Value], other: list[ir.Value]) -> list[ir.Value]:
        b, s = self.em.builder, self.s
        if self.monoids is not None:
            return [S.binary(b, fn, x, y, a.dtype) for (fn, _), x, y, a in zip(self.monoids, mine, other, s.accumulators)]
        value, index, term, cond = self.arg
        mine_first = b.icmp_signed("<", mine[1], other[1])      # by index: the earlier takes the later
        first = [b.select(mine_first, m, o) for m, o in zip(mine, other)]
        second = [b.select(mine_first, o, m) for m, o in zip(mine, other)]
        self.em.forget_values()
        take = self.em.expr(cond, {**self.env, term: second[0], value: first[0]})
        return [b.select(take, x, y) for x, y in zip(second, first)]

    def finish(self, totals: list[ir.Value]) -> None:
        """Bind the accumulator names to the Reduce's results."""
        em, s = self.em, self.s
        em.forget_values()
        if self.monoids is None:
            self.env.update((a.name, t) for a, t in zip(s.accumulators, totals))
            return
        for (fn, _), a, total in zip(self.monoids, s.accumulators, totals):
            self.env[a.name] = S.binary(em.builder, fn, em.expr(a.init, self.env), total, a.dtype)


def block_allreduce(em: GpuEmitter, comb: Combiner, values: list[ir.Value]) -> list[ir.Value]:
    """Every thread's copy of the block-wide merge of the threads' partials."""
    b = em.builder
    for mask in (16, 8, 4, 2, 1):
        values = comb.merge(values, [X.shuffle_xor(b, v, mask) for v in values])
    warps = em.threads // 32
    if warps <= 1:
        return values
    tid = X.sreg(b, "tid.x")
    warp, lane = b.lshr(tid, ir.Constant(S.I32, 5)), b.and_(tid, ir.Constant(S.I32, 31))
    arrays = [em.shared_array("warp_totals", _memory(v.type), warps) for v in values]
    with b.if_then(b.icmp_unsigned("==", lane, ir.Constant(S.I32, 0))):
        for arr, v in zip(arrays, values):
            b.store(b.zext(v, S.I8) if v.type == S.I1 else v, X.shared_element(b, arr, warp))
    X.barrier(b)
    totals = None
    for w in range(warps):
        row = []
        for arr, v in zip(arrays, values):
            x = b.load(X.shared_element(b, arr, ir.Constant(S.I32, w)), typ=_memory(v.type))
            row.append(b.icmp_unsigned("!=", x, ir.Constant(S.I8, 0)) if v.type == S.I1 else x)
        totals = row if totals is None else comb.merge(totals, row)
    X.barrier(b)
    return totals


def thread_partials(em: GpuEmitter, comb: Combiner, start: ir.Value, stop: ir.Value,
                    step: ir.Value) -> list[ir.Value]:
    """One thread's fold of the terms of the Reduce at r = start, start + step, ... < stop."""
    s = comb.s
    saved, em.uniform = em.uniform, False
    with strided_loop(em.builder, start, stop, step, s.var, comb.starts()) as loop:
        inner = {**comb.env, s.var: loop.index}
        em.emit_body(s.body, inner)
        loop.next = comb.fold(list(loop.carried), inner)
    em.forget_values()              # values made in the loop body do not dominate its exit
    em.uniform = saved
    return list(loop.carried)


def block_reduce(em: GpuEmitter, s: Reduce, env: dict) -> None:
    """`s` computed by the whole block; every thread ends with the accumulators bound."""
    comb = Combiner(em, s, env)
    parts = thread_partials(em, comb, em.sreg64("tid.x"), em.extent(s.extent, env), em.sreg64("ntid.x"))
    comb.finish(block_allreduce(em, comb, parts))


def emit_split(em: GpuEmitter) -> None:
    """A `partials` or `finish` launch (launch.py): rows of the nest, one Reduce each."""
    launch, b = em.launch, em.builder
    stmts = launch.stmts
    dims, body = perfect_nest(stmts[0]) if isinstance(stmts[0], Loop) else ([], stmts)
    at = next(i for i, st in enumerate(body) if isinstance(st, Reduce))
    s = body[at]
    env = em.entry_env()
    chunks = ir.Constant(S.I64, launch.chunks)
    row = em.sreg64("ctaid.y" if launch.kind == "partials" else "ctaid.x")
    em.delinearize(row, dims, env)
    em.uniform = True
    em.emit_body(body[:at], env)            # Lets the Reduce reads
    comb = Combiner(em, s, env)
    spaces = [(arg, S.memory_type(w.dtype), w.dtype) for w, arg in em.workspaces.values()]
    if launch.kind == "partials":
        chunk = em.sreg64("ctaid.x")
        extent = em.extent(s.extent, env)        # (a run-time length: chunks of a run-time size)
        size = b.udiv(b.add(extent, ir.Constant(S.I64, launch.chunks - 1)), chunks)
        lo = b.mul(chunk, size)
        hi = S.intrinsic(b, "smin", [b.add(lo, size), extent])
        parts = thread_partials(em, comb, b.add(lo, em.sreg64("tid.x")), hi, em.sreg64("ntid.x"))
        totals = block_allreduce(em, comb, parts)
        slot = b.add(b.mul(row, chunks), chunk)
        with em.thread0():
            for total, (space, mem, dtype) in zip(totals, spaces):
                S.store_value(b, total, b.gep(space, [slot], inbounds=True, source_etype=mem), dtype)
        em.uniform = False
        return
    base = b.mul(row, chunks)
    with strided_loop(b, em.sreg64("tid.x"), chunks, em.sreg64("ntid.x"), "chunk", comb.starts()) as loop:
        slot = b.add(base, loop.index)
        loaded = [S.load_value(b, b.gep(space, [slot], inbounds=True, source_etype=mem), dtype)
                  for space, mem, dtype in spaces]
        loop.next = comb.merge(list(loop.carried), loaded)
    em.forget_values()
    comb.finish(block_allreduce(em, comb, list(loop.carried)))
    em.emit_body(body[at + 1:], env)
    em.uniform = False
