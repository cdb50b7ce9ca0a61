"""A loop-IR Matmul as a shared-memory tiled CUDA kernel.

A block of T x T threads (T = launch.MATMUL_TILE) owns a T x T tile of the output, thread
(x, y) the element (i, j) = (tile_i*T + y, tile_j*T + x).  For each step of T along k the
block stages a T x T tile of `a` and of `b` in shared memory (thread (x, y) loads one
element of each: consecutive threads read consecutive k of `a` and consecutive j of `b`),
waits at a barrier, and each thread accumulates a row of As times a column of Bs (fused
multiply-adds for floats), then waits again before the tiles are overwritten.  Elements
outside the operands are staged as 0 and read at clamped, in-bounds indices.  Blocks
stride over tiles and batches, so any size runs on a fixed grid (x: tiles of n, y: tiles
of m, z: batch).  The epilogue and `accumulate` are applied where the element is stored.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..lower import llvm_scalar as S
from ..lower.loops import Matmul, View
from . import nvptx_intrinsics as X
from .launch import MATMUL_TILE
from .nvptx_codegen import GpuEmitter, strided_loop


def _view_terms(em: GpuEmitter, view: View, env: dict) -> tuple[ir.Value, list[ir.Value]]:
    """The view's offset and strides, computed once before the loops (they read sizes only)."""
    em._cache.clear()
    return em.expr(view.offset, env), [em.expr(st, env) for st in view.strides]


def _view_pointer(em: GpuEmitter, view: View, index: list[ir.Value], env: dict, dtype) -> ir.Value:
    """Address of element `index` of the strided view (offset + sum(index * stride))."""
    b = em.builder
    flat, strides = em.view_terms[id(view)]
    for i, stride in zip(index, strides):
        flat = b.add(flat, b.mul(i, stride, flags=("nsw",)), flags=("nsw",))
    _, ptr = em._buffer(view.buffer)
    return b.gep(ptr, [flat], inbounds=True, source_etype=S.memory_type(dtype))


def _tile_load(em, view, batch, row, col, rows, cols, env, dtype) -> ir.Value:
    """view[batch, row, col] if inside (rows, cols), else 0; never reads out of bounds."""
    b = em.builder
    one = ir.Constant(S.I64, 1)
    inside = b.and_(b.icmp_signed("<", row, rows), b.icmp_signed("<", col, cols))
    r = S.intrinsic(b, "smin", [row, b.sub(rows, one)])
    c = S.intrinsic(b, "smin", [col, b.sub(cols, one)])
    value = S.load_value(b, _view_pointer(em, view, [*batch, r, c], env, dtype), dtype)
    return b.select(inside, value, S.constant(0, dtype))


def emit_matmul(em: GpuEmitter, s: Matmul) -> None:
    b, t = em.builder, MATMUL_TILE
    dtype = em.kernel.buffer(s.out.buffer).dtype
    elem = S.register_type(dtype)
    env = em.entry_env()
    em.view_terms = {id(v): _view_terms(em, v, env) for v in s.views()}
    m, n, k = em.extent(s.m), em.extent(s.n), em.extent(s.k)
    tile = ir.Constant(S.I64, t)
    tiles_m = b.udiv(b.add(m, ir.Constant(S.I64, t - 1)), tile)
    tiles_n = b.udiv(b.add(n, ir.Constant(S.I64, t - 1)), tile)
    tiles_k = b.udiv(b.add(k, ir.Constant(S.I64, t - 1)), tile)
    tx, ty = em.sreg64("tid.x"), em.sreg64("tid.y")
    a_tile = em.shared_array("a_tile", elem, t * t)
    b_tile = em.shared_array("b_tile", elem, t * t)
    here = b.trunc(b.add(b.mul(ty, tile), tx), S.I32)
    batches = em.product(s.batch)
    with strided_loop(b, em.sreg64("ctaid.z"), batches, em.sreg64("nctaid.z"), "batch") as bl:
        names = list(s.index[:len(s.batch)]) if s.index else [f"b{d}" for d in range(len(s.batch))]
        em.delinearize(bl.index, list(zip(names, s.batch)), env)
        batch = [env[nm] for nm in names]
        with strided_loop(b, em.sreg64("ctaid.y"), tiles_m, em.sreg64("nctaid.y"), "tile_i") as il:
            with strided_loop(b, em.sreg64("ctaid.x"), tiles_n, em.sreg64("nctaid.x"), "tile_j") as jl:
                i = b.add(b.mul(il.index, tile), ty, name="i")
                j = b.add(b.mul(jl.index, tile), tx, name="j")
                zero = S.constant(0, dtype)
                with strided_loop(b, ir.Constant(S.I64, 0), tiles_k, ir.Constant(S.I64, 1), "kt", [zero]) as kl:
                    p0 = b.mul(kl.index, tile)
                    b.store(_tile_load(em, s.a, batch, i, b.add(p0, tx), m, k, env, dtype),
                            X.shared_element(b, a_tile, here))
                    b.store(_tile_load(em, s.b, batch, b.add(p0, ty), j, k, n, env, dtype),
                            X.shared_element(b, b_tile, here))
                    X.barrier(b)
                    acc = kl.carried[0]
                    row, col = b.trunc(b.mul(ty, tile), S.I32), b.trunc(tx, S.I32)
                    for q in range(t):
                        x = b.load(X.shared_element(b, a_tile, b.add(row, ir.Constant(S.I32, q))), typ=elem)
                        y = b.load(X.shared_element(b, b_tile, b.add(col, ir.Constant(S.I32, q * t))), typ=elem)
                        acc = (S.intrinsic(b, "fmuladd", [x, y, acc]) if S.kind(dtype) == "f"
                               else b.add(acc, b.mul(x, y)))
                    X.barrier(b)
                    kl.next = [acc]
                inside = b.and_(b.icmp_signed("<", i, m), b.icmp_signed("<", j, n))
                with b.if_then(inside):
                    _store(em, s, kl.carried[0], batch, i, j, env, dtype)
                jl.next = []
            il.next = []
        bl.next = []


def _store(em, s: Matmul, acc: ir.Value, batch, i, j, env: dict, dtype) -> None:
    b = em.builder
    out = _view_pointer(em, s.out, [*batch, i, j], env, dtype)
    if s.accumulate:
        old = S.load_value(b, out, dtype)
        acc = b.fadd(acc, old) if S.kind(dtype) == "f" else b.add(acc, old)
    value = acc
    if s.epilogue is not None:
        inner = {**env, s.acc: acc}
        inner.update(zip(s.index, [*batch, i, j]))
        em._cache.clear()
        value = em.expr(s.epilogue, inner)
    S.store_value(b, value, out, dtype)
