"""Reductions shared by the threads of a block, and split over several blocks.

A Reduce whose accumulators are monoids (`acc = acc fn term`, fn associative and
commutative: launch.monoid_updates) is computed by a block as:
  1. thread t folds terms t, t + T, t + 2T, ... into partials that start from fn's
     identity (T threads; consecutive threads read consecutive terms: coalesced);
  2. the 32 lanes of each warp combine their partials with butterfly shuffles
     (`llvm.nvvm.shfl.sync.bfly`), so every lane holds its warp's total;
  3. lane 0 of each warp writes that total to shared memory; after a barrier every thread
     combines the warp totals in warp order (a fixed order: the result is deterministic);
     a second barrier keeps the shared slots alive until all threads have read them;
  4. the accumulator's initial value is combined in once, so the result is the Reduce's.
For few long rows (launch.py: partials/finish) step 1 runs over one chunk of a row per
block and thread 0 writes the block's partials to a workspace; the finish launch folds
a row's chunk partials the same way and then runs the rest of the row's body.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from ..lower import llvm_scalar as S
from ..lower.loops import Loop, Reduce
from . import nvptx_intrinsics as X
from .launch import cooperative, monoid_updates, perfect_nest
from .nvptx_codegen import GpuEmitter, strided_loop


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


def block_allreduce(em: GpuEmitter, parts: list[tuple[str, object, ir.Value]]) -> list[ir.Value]:
    """Every thread's copy of the block-wide combination of [(fn, dtype, partial)]."""
    b = em.builder
    values = [v for _, _, v in parts]
    for mask in (16, 8, 4, 2, 1):
        values = [S.binary(b, fn, v, X.shuffle_xor(b, v, mask), t) for (fn, t, _), v in zip(parts, values)]
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
    totals = []
    for (fn, t, v), arr in zip(parts, arrays):
        total = None
        for w in range(warps):
            x = b.load(X.shared_element(b, arr, ir.Constant(S.I32, w)), typ=_memory(v.type))
            x = b.icmp_unsigned("!=", x, ir.Constant(S.I8, 0)) if v.type == S.I1 else x
            total = x if total is None else S.binary(b, fn, total, x, t)
        totals.append(total)
    X.barrier(b)
    return totals


def thread_partials(em: GpuEmitter, s: Reduce, env: dict, start: ir.Value, stop: ir.Value,
                    step: ir.Value) -> list[ir.Value]:
    """One thread's fold of the terms of `s` at r = start, start + step, ... < stop."""
    monoids = monoid_updates(s)
    inits = [identity(fn, a.dtype) for (fn, _), a in zip(monoids, s.accumulators)]
    saved, em.uniform = em.uniform, False
    with strided_loop(em.builder, start, stop, step, s.var, inits) as loop:
        inner = {**env, s.var: loop.index}
        em.emit_body(s.body, inner)
        em._cache.clear()
        loop.next = [S.binary(em.builder, fn, acc, em.expr(term, inner), a.dtype)
                     for (fn, term), acc, a in zip(monoids, loop.carried, s.accumulators)]
    em._cache.clear()              # values made in the loop body do not dominate its exit
    em.uniform = saved
    return list(loop.carried)


def _finish(em: GpuEmitter, s: Reduce, env: dict, totals: list[ir.Value]) -> None:
    """Combine each accumulator's initial value into its total and bind the names."""
    b = em.builder
    for (fn, _), a, total in zip(monoid_updates(s), s.accumulators, totals):
        env[a.name] = S.binary(b, fn, em.expr(a.init, env), total, a.dtype)


def block_reduce(em: GpuEmitter, s: Reduce, env: dict) -> None:
    """`s` computed by the whole block; every thread ends with the accumulators bound."""
    parts = thread_partials(em, s, env, em.sreg64("tid.x"), em.extent(s.extent), em.sreg64("ntid.x"))
    totals = block_allreduce(em, [(fn, a.dtype, p) for (fn, _), a, p in
                                  zip(monoid_updates(s), s.accumulators, parts)])
    _finish(em, s, env, totals)


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
    spaces = [arg for _, arg in em.workspaces.values()]
    fns = [fn for fn, _ in monoid_updates(s)]
    if launch.kind == "partials":
        chunk = em.sreg64("ctaid.x")
        size = -(-s.extent // launch.chunks)
        lo = b.mul(chunk, ir.Constant(S.I64, size))
        hi = S.intrinsic(b, "smin", [b.add(lo, ir.Constant(S.I64, size)), ir.Constant(S.I64, s.extent)])
        parts = thread_partials(em, s, env, b.add(lo, em.sreg64("tid.x")), hi, em.sreg64("ntid.x"))
        totals = block_allreduce(em, [(fn, a.dtype, p) for fn, a, p in zip(fns, s.accumulators, parts)])
        slot = b.add(b.mul(row, chunks), chunk)
        with em.thread0():
            for total, space, a in zip(totals, spaces, s.accumulators):
                ptr = b.gep(space, [slot], inbounds=True, source_etype=S.memory_type(a.dtype))
                S.store_value(b, total, ptr, a.dtype)
        em.uniform = False
        return
    base = b.mul(row, chunks)
    inits = [identity(fn, a.dtype) for fn, a in zip(fns, s.accumulators)]
    with strided_loop(b, em.sreg64("tid.x"), chunks, em.sreg64("ntid.x"), "chunk", inits) as loop:
        slot = b.add(base, loop.index)
        loop.next = [S.binary(b, fn, acc, S.load_value(b, b.gep(space, [slot], inbounds=True,
                                                               source_etype=S.memory_type(a.dtype)), a.dtype), a.dtype)
                     for fn, acc, space, a in zip(fns, loop.carried, spaces, s.accumulators)]
    totals = block_allreduce(em, [(fn, a.dtype, p) for fn, a, p in zip(fns, s.accumulators, loop.carried)])
    _finish(em, s, env, totals)
    em.emit_body(body[at + 1:], env)
    em.uniform = False

