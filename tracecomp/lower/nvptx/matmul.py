"""A loop-IR Matmul as a shared-memory tiled, register-blocked CUDA kernel.

A block of 16 x 16 threads owns a 64 x 64 tile of the output (launch.MATMUL_TILE);
thread (x, y) computes the 4 x 4 elements (i, j) = (y + 16u, x + 16v), u, v < 4, of it,
in registers.  For each step of 16 along k the block stages the 64 x 16 slice of `a`
(transposed, rows padded to 65 elements against bank conflicts) and the 16 x 64 slice of
`b` in shared memory: 4 elements of each per thread, consecutive threads reading
consecutive k of `a` and consecutive j of `b` (coalesced for row-major operands); after a
barrier each thread does 16 x 16 multiply-adds (fused for floats) from 8 shared loads
per k, and a second barrier guards the tiles before they are overwritten.  Elements
outside the operands are staged as 0, read at clamped in-bounds indices.  Blocks stride
over tiles and batches, so any size runs on a fixed grid (x: tiles of n, y: tiles of m,
z: batch).  The epilogue and `accumulate` are applied where each element is stored.
Expected against the 16 x 16, one-element-per-thread version: ~3-4x the FLOP rate on an
A100-class GPU (a quarter of the shared-memory traffic per FMA); not measured here (no GPU).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..llvm import scalar as S
from ..loops.ir import Matmul, View
from . import intrinsics as X
from .launch import MATMUL_K, MATMUL_THREADS, MATMUL_TILE
from .codegen import GpuEmitter, strided_loop


def _view_terms(em: GpuEmitter, view: View, env: dict) -> tuple[ir.Value, list[ir.Value]]:
    """The view's offset and strides, computed once before the loops (they read sizes only)."""
    em.forget_values()
    return em.expr(view.offset, env), [em.expr(st, env) for st in view.strides]


def view_pointer(em: GpuEmitter, view: View, index: list[ir.Value], dtype) -> ir.Value:
    """Address of element `index` of the strided view (offset + sum(index * stride))."""
    b = em.builder
    flat, strides = em.view_terms[id(view)]
    for i, stride in zip(index, strides):
        flat = b.add(flat, b.mul(i, stride, flags=("nsw",)), flags=("nsw",))
    _, ptr = em._buffer(view.buffer)
    return b.gep(ptr, [flat], inbounds=True, source_etype=S.memory_type(dtype))


def tile_load(em, view, batch, row, col, rows, cols, dtype) -> ir.Value:
    """view[batch, row, col] if inside (rows, cols), else 0; never reads out of bounds."""
    b = em.builder
    one = ir.Constant(S.I64, 1)
    inside = b.and_(b.icmp_signed("<", row, rows), b.icmp_signed("<", col, cols))
    r = S.intrinsic(b, "smin", [row, b.sub(rows, one)])
    c = S.intrinsic(b, "smin", [col, b.sub(cols, one)])
    value = S.load_value(b, view_pointer(em, view, [*batch, r, c], dtype), dtype)
    return b.select(inside, value, S.constant(0, dtype))


def i64(v: int) -> ir.Constant:
    return ir.Constant(S.I64, v)


def i32(v: int) -> ir.Constant:
    return ir.Constant(S.I32, v)


def product_extents(em: GpuEmitter, s: Matmul, tile: int, kstep: int) -> tuple:
    """What every matmul kernel starts with: the views' address terms (kept on `em`), then
    (the entry's index env, m, n, k, tiles along m, tiles along n, steps along k)."""
    b = em.builder
    env = em.entry_env()
    em.view_terms = {id(v): _view_terms(em, v, env) for v in s.views()}
    m, n, k = em.extent(s.m), em.extent(s.n), em.extent(s.k)

    def blocks(x: ir.Value, size: int) -> ir.Value:
        return b.udiv(b.add(x, i64(size - 1)), i64(size))
    return env, m, n, k, blocks(m, tile), blocks(n, tile), blocks(k, kstep)


def emit_matmul(em: GpuEmitter, s: Matmul) -> None:
    b, tile, threads, kstep = em.builder, MATMUL_TILE, MATMUL_THREADS, MATMUL_K
    per = tile // threads                          # elements per thread along i and j
    dtype = em.kernel.buffer(s.out.buffer).dtype
    elem = S.register_type(dtype)
    env, m, n, k, tiles_m, tiles_n, steps_k = product_extents(em, s, tile, kstep)
    tx, ty = em.sreg64("tid.x"), em.sreg64("tid.y")
    linear = b.add(b.mul(ty, i64(threads)), tx)
    a_tile = em.shared_array("a_tile", elem, kstep * (tile + 1))      # [k][i], padded rows
    b_tile = em.shared_array("b_tile", elem, kstep * tile)            # [k][j]
    batches = em.product(s.batch)
    zero = S.constant(0, dtype)
    with strided_loop(b, em.sreg64("ctaid.z"), batches, em.sreg64("nctaid.z"), "batch") as bl:
        names = list(s.index[:len(s.batch)]) if s.index else [f"b{d}" for d in range(len(s.batch))]
        em.delinearize(bl.index, list(zip(names, s.batch)), env)
        batch = [env[nm] for nm in names]
        with strided_loop(b, em.sreg64("ctaid.y"), tiles_m, em.sreg64("nctaid.y"), "tile_i") as il:
            with strided_loop(b, em.sreg64("ctaid.x"), tiles_n, em.sreg64("nctaid.x"), "tile_j") as jl:
                i0, j0 = b.mul(il.index, i64(tile)), b.mul(jl.index, i64(tile))
                with strided_loop(b, i64(0), steps_k, i64(1), "kt", [zero] * (per * per)) as kl:
                    p0 = b.mul(kl.index, i64(kstep))
                    _stage(em, s, batch, i0, j0, p0, linear, m, n, k, a_tile, b_tile, dtype)
                    X.barrier(b)
                    kl.next = _multiply(em, list(kl.carried), tx, ty, a_tile, b_tile, elem, dtype)
                    X.barrier(b)
                for u in range(per):
                    for v in range(per):
                        i = b.add(i0, b.add(ty, i64(threads * u)), name="i")
                        j = b.add(j0, b.add(tx, i64(threads * v)), name="j")
                        inside = b.and_(b.icmp_signed("<", i, m), b.icmp_signed("<", j, n))
                        with b.if_then(inside):
                            store_product(em, s, kl.carried[u * per + v], batch, i, j, env, dtype)
                jl.next = []
            il.next = []
        bl.next = []


def _stage(em, s: Matmul, batch, i0, j0, p0, linear, m, n, k, a_tile, b_tile, dtype) -> None:
    """This thread's share of the a and b slices for the k step at p0, into shared memory
    (half operands of a float32 product load widened: loops/check_matmul.py)."""
    b, tile, kstep = em.builder, MATMUL_TILE, MATMUL_K
    loads = tile * kstep // (MATMUL_THREADS * MATMUL_THREADS)
    for step in range(loads):
        e = b.add(linear, i64(step * MATMUL_THREADS * MATMUL_THREADS))
        row, p = b.udiv(e, i64(kstep)), b.urem(e, i64(kstep))          # a: (i, k) with k fastest
        value = tile_load(em, s.a, batch, b.add(i0, row), b.add(p0, p), m, k, em.kernel.buffer(s.a.buffer).dtype)
        slot = b.trunc(b.add(b.mul(p, i64(tile + 1)), row), S.I32)
        b.store(value, X.shared_element(b, a_tile, slot))
        p, col = b.udiv(e, i64(tile)), b.urem(e, i64(tile))            # b: (k, j) with j fastest
        value = tile_load(em, s.b, batch, b.add(p0, p), b.add(j0, col), k, n, em.kernel.buffer(s.b.buffer).dtype)
        b.store(value, X.shared_element(b, b_tile, b.trunc(e, S.I32)))


def _multiply(em, acc: list, tx, ty, a_tile, b_tile, elem, dtype) -> list:
    """acc[u][v] += sum over the staged k of a[ty + 16u][k] * b[k][tx + 16v]."""
    b, tile, threads = em.builder, MATMUL_TILE, MATMUL_THREADS
    per = tile // threads
    row, col = b.trunc(ty, S.I32), b.trunc(tx, S.I32)
    for q in range(MATMUL_K):
        xs = [b.load(X.shared_element(b, a_tile, b.add(row, i32(q * (tile + 1) + threads * u))), typ=elem)
              for u in range(per)]
        ys = [b.load(X.shared_element(b, b_tile, b.add(col, i32(q * tile + threads * v))), typ=elem)
              for v in range(per)]
        for u in range(per):
            for v in range(per):
                a = acc[u * per + v]
                acc[u * per + v] = (S.intrinsic(b, "fmuladd", [xs[u], ys[v], a]) if S.kind(dtype) == "f"
                                    else b.add(a, b.mul(xs[u], ys[v])))
    return acc


def store_product(em, s: Matmul, acc: ir.Value, batch, i, j, env: dict, dtype) -> None:
    b = em.builder
    out = view_pointer(em, s.out, [*batch, i, j], dtype)
    if s.accumulate:
        old = S.load_value(b, out, dtype)
        acc = b.fadd(acc, old) if S.kind(dtype) == "f" else b.add(acc, old)
    value = acc
    if s.epilogue is not None:
        inner = {**env, s.acc: acc}
        inner.update(zip(s.index, [*batch, i, j]))
        em.forget_values()
        value = em.expr(s.epilogue, inner)
    S.store_value(b, value, out, dtype)
