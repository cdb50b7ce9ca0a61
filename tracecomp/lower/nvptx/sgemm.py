"""A large float32 Matmul as a register-blocked SGEMM (launch kind "matmul", tile 128).

A block of 256 threads owns a 128 x 128 output tile; thread t = 16 ty + tx computes the
8 x 8 elements at rows ty*4 + {0..3} and 64 + ty*4 + {0..3}, columns tx*4 + {0..3} and
64 + tx*4 + {0..3} of it, in 64 accumulator registers.  Along k it steps 8 at a time:
both operands' 8 x 128 slices sit in shared memory k-major ([k][i] for a: transposed;
[k][j] for b), so each step of k feeds 64 FMAs from four 16-byte ld.shared.v4 loads.
The slices are double buffered: the next slice is read from global memory into
registers before the FMAs on the current one, written to the other buffer after them,
and one barrier per step separates the two (global latency hides behind the FMAs).

Global reads: each thread reads 4 consecutive elements of each operand per step along
the operand's contiguous direction (k for a row-major a or a transposed b, else i or j):
one ld.global.v4 where the whole vector lies inside the operand and the view allows it
(the buffer is 16-byte aligned, the contiguous stride is 1 and the offset and other
strides are multiples of 4: checked at run time, uniform), else 4 clamped scalar loads that read 0 outside (edges, k % 4,
odd strides).  Shared rows are padded to 132 floats, so neither the transposing scalar
stores nor the vector reads conflict on banks.  The epilogue (matmul.py's store_product: bias,
relu, accumulate) runs per element where it is stored.

ptxas (sm_90): 128 registers (capped for 2 blocks per SM: mark_kernel's min_blocks), no
local memory in the vector-only k loop; the tile setup, the last k steps and the
epilogue may spill a few registers (they run once per tile).  Measured on an H100,
4096^3: 3.10 ms (44 TFLOP/s) against cuBLAS's 2.68 ms without TF32 (the 64 x 64 kernel:
6.3 ms).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..llvm import scalar as S
from ..loops.ir import Matmul, View
from . import intrinsics as X
from .codegen import GpuEmitter, strided_loop
from .launch import static_extent
from .matmul import i32, i64, store_product, tile_load, view_pointer, product_extents
from .vector import aligned16, load_vector, store_vector

TILE = 128          # output tile per block
HALF = TILE // 2
BK = 8              # k per step
THREADS = 256
LD = TILE + 4       # padded shared row (floats); 16-byte multiple for v4 reads
SLICE = BK * LD     # one operand's slice
STAGE = 2 * SLICE   # both operands' slices of one buffer


class Operand:
    """How one operand's 8 x 128 slice is read: `view` with the tile dimension (i of a, j
    of b) at position `mn` and k at position `kd` of its last two indices."""

    def __init__(self, em: GpuEmitter, view: View, k_first: bool, tid, extent_mn, extent_k):
        b = em.builder
        self.em, self.view, self.k_first = em, view, k_first
        self.extent_mn, self.extent_k = extent_mn, extent_k
        off, strides = em.view_terms[id(view)]
        s_k, s_mn = (strides[-2], strides[-1]) if k_first else (strides[-1], strides[-2])
        static_k = static_extent(view.strides[-2] if k_first else view.strides[-1])
        self.k_contig = static_k == 1          # 4 consecutive k per thread, else 4 along i/j
        contiguous, others = (s_k, [s_mn]) if self.k_contig else (s_mn, [s_k])
        others += [off] + list(strides[:-2])
        bits = others[0]
        for v in others[1:]:
            bits = b.or_(bits, v)
        self.vector_ok = b.and_(b.and_(b.icmp_signed("==", contiguous, i64(1)),
                                       b.icmp_signed("==", b.and_(bits, i64(3)), i64(0))),
                                aligned16(b, [em.buffer_pointer(view.buffer)]))
        if self.k_contig:       # (mn, k..k+3): t >> 1, (t & 1) * 4
            self.mn, self.kk = b.lshr(tid, i64(1)), b.mul(b.and_(tid, i64(1)), i64(4))
        else:                   # (k, mn..mn+3): t >> 5, (t & 31) * 4
            self.kk, self.mn = b.lshr(tid, i64(5)), b.mul(b.and_(tid, i64(31)), i64(4))

    def _element(self, batch, mn, k, dtype):
        if self.k_first:
            return tile_load(self.em, self.view, batch, k, mn, self.extent_k, self.extent_mn, dtype)
        return tile_load(self.em, self.view, batch, mn, k, self.extent_mn, self.extent_k, dtype)

    def _at(self, batch, base_mn, p0):
        b = self.em.builder
        return b.add(base_mn, self.mn), b.add(p0, self.kk)

    def fast(self, batch, base_mn, p0, dtype) -> list[ir.Value]:
        """This thread's 4 elements of the slice at k = p0 as one vector load (the tile
        lies inside the operand and vector_ok holds)."""
        mn, k = self._at(batch, base_mn, p0)
        index = [*batch, k, mn] if self.k_first else [*batch, mn, k]
        return load_vector(self.em.builder, view_pointer(self.em, self.view, index, dtype), S.register_type(dtype))

    def fetch(self, batch, base_mn, p0, dtype) -> list[ir.Value]:
        """This thread's 4 elements of the slice at k = p0, anywhere: a vector load where
        they lie inside and vector_ok holds, else clamped scalar loads (0 outside)."""
        b = self.em.builder
        mn, k = self._at(batch, base_mn, p0)
        if self.k_contig:
            inside = b.and_(b.icmp_signed("<", mn, self.extent_mn), b.icmp_signed("<", b.add(k, i64(3)), self.extent_k))
            points = [(mn, b.add(k, i64(q))) for q in range(4)]
        else:
            inside = b.and_(b.icmp_signed("<", k, self.extent_k), b.icmp_signed("<", b.add(mn, i64(3)), self.extent_mn))
            points = [(b.add(mn, i64(q)), k) for q in range(4)]
        elem = S.register_type(dtype)
        with b.if_else(b.and_(inside, self.vector_ok)) as (vec, scalar):
            with vec:
                fast = self.fast(batch, base_mn, p0, dtype)
                fast_block = b.block
            with scalar:
                slow = [self._element(batch, pm, pk, dtype) for pm, pk in points]
                slow_block = b.block
        out = []
        for x, y in zip(fast, slow):
            phi = b.phi(elem)
            phi.add_incoming(x, fast_block)
            phi.add_incoming(y, slow_block)
            out.append(phi)
        return out

    def stage(self, smem, base: ir.Value, values: list[ir.Value]) -> None:
        """Write the fetched elements to the operand's slice at `base` (k-major)."""
        b = self.em.builder
        mn, kk = b.trunc(self.mn, S.I32), b.trunc(self.kk, S.I32)
        if self.k_contig:
            for q, v in enumerate(values):
                slot = b.add(base, b.add(b.mul(b.add(kk, i32(q)), i32(LD)), mn))
                b.store(v, X.shared_element(b, smem, slot))
        else:
            slot = b.add(base, b.add(b.mul(kk, i32(LD)), mn))
            store_vector(b, X.shared_element(b, smem, slot), values)


def emit_sgemm(em: GpuEmitter, s: Matmul) -> None:
    b = em.builder
    dtype = em.kernel.buffer(s.out.buffer).dtype
    env, m, n, k, tiles_m, tiles_n, steps_k = product_extents(em, s, TILE, BK)
    tid = em.sreg64("tid.x")
    tx, ty = b.and_(tid, i64(15)), b.lshr(tid, i64(4))
    a_op = Operand(em, s.a, False, tid, m, k)
    b_op = Operand(em, s.b, True, tid, n, k)
    a_col = b.trunc(b.mul(ty, i64(4)), S.I32)           # this thread's rows / columns in the slices
    b_col = b.trunc(b.mul(tx, i64(4)), S.I32)
    smem = em.shared_array("stages", S.register_type(dtype), 2 * STAGE)
    ctx = (s, env, dtype, m, n, k, tiles_m, tiles_n, steps_k, smem, a_op, b_op, a_col, b_col)
    if not s.batch:                 # (the grid has one z: no loop, fewer live registers)
        _tiles(em, ctx, [])
        return
    with strided_loop(b, em.sreg64("ctaid.z"), em.product(s.batch), em.sreg64("nctaid.z"), "batch") as bl:
        names = list(s.index[:len(s.batch)]) if s.index else [f"b{d}" for d in range(len(s.batch))]
        em.delinearize(bl.index, list(zip(names, s.batch)), env)
        _tiles(em, ctx, [env[nm] for nm in names])
        bl.next = []


def _tiles(em, ctx, batch) -> None:
    """The block's output tiles of one batch item (blocks stride over tiles: 32-bit)."""
    s, env, dtype, m, n, k, tiles_m, tiles_n, steps_k, smem, a_op, b_op, a_col, b_col = ctx
    b = em.builder
    zero = S.constant(0, dtype)
    elem = S.register_type(dtype)
    tid = em.sreg64("tid.x")
    tx, ty = b.and_(tid, i64(15)), b.lshr(tid, i64(4))
    with strided_loop(b, X.sreg(b, "ctaid.y"), b.trunc(tiles_m, S.I32), X.sreg(b, "nctaid.y"), "tile_i") as il:
        with strided_loop(b, X.sreg(b, "ctaid.x"), b.trunc(tiles_n, S.I32), X.sreg(b, "nctaid.x"), "tile_j") as jl:
            i0 = b.mul(b.zext(il.index, S.I64), i64(TILE))
            j0 = b.mul(b.zext(jl.index, S.I64), i64(TILE))
            a_op.stage(smem, i32(0), a_op.fetch(batch, i0, i64(0), dtype))
            b_op.stage(smem, i32(SLICE), b_op.fetch(batch, j0, i64(0), dtype))
            X.barrier(b)
            # interior tiles with vector-readable operands run their full k steps but the
            # last from vector loads alone (a loop with few live registers); the rest,
            # and every step of an edge tile, read through the general fetch
            interior = b.and_(b.and_(b.icmp_signed("<=", b.add(i0, i64(TILE)), m),
                                     b.icmp_signed("<=", b.add(j0, i64(TILE)), n)),
                              b.and_(a_op.vector_ok, b_op.vector_ok))
            full = b.select(interior, b.udiv(k, i64(BK)), i64(0))
            first = b.select(b.icmp_signed(">", full, i64(0)), b.sub(full, i64(1)), i64(0))
            acc = [zero] * 64
            for lo, hi, fetch in ((i64(0), first, "fast"), (first, steps_k, "fetch")):
                with strided_loop(b, lo, hi, i64(1), "kt", acc) as kl:
                    nxt = b.mul(b.add(kl.index, i64(1)), i64(BK))
                    ra = getattr(a_op, fetch)(batch, i0, nxt, dtype)     # the next slice
                    rb = getattr(b_op, fetch)(batch, j0, nxt, dtype)     # (clamped past k)
                    parity = b.trunc(b.and_(kl.index, i64(1)), S.I32)
                    here = b.mul(parity, i32(STAGE))
                    out = _multiply(em, list(kl.carried), smem, here, a_col, b_col, elem)
                    there = b.mul(b.xor(parity, i32(1)), i32(STAGE))
                    a_op.stage(smem, there, ra)
                    b_op.stage(smem, b.add(there, i32(SLICE)), rb)
                    X.barrier(b)
                    kl.next = out
                acc = list(kl.carried)
            for u in range(8):
                i = b.add(i0, b.add(b.mul(ty, i64(4)), i64(u % 4 + HALF * (u // 4))), name="i")
                for v in range(8):
                    j = b.add(j0, b.add(b.mul(tx, i64(4)), i64(v % 4 + HALF * (v // 4))), name="j")
                    inside = b.and_(b.icmp_signed("<", i, m), b.icmp_signed("<", j, n))
                    with b.if_then(inside):
                        store_product(em, s, acc[u * 8 + v], batch, i, j, env, dtype)
            jl.next = []
        il.next = []


def _multiply(em, acc: list, smem, here, a_col, b_col, elem) -> list:
    """acc[u][v] += a[k][row u] * b[k][col v] over the 8 k of the slice at `here`."""
    b = em.builder
    for kk in range(BK):
        row = b.add(a_col, i32(kk * LD))
        col = b.add(b_col, i32(SLICE + kk * LD))
        xs = _quads(b, smem, here, row, elem)
        ys = _quads(b, smem, here, col, elem)
        for u in range(8):
            for v in range(8):
                acc[u * 8 + v] = S.intrinsic(b, "fmuladd", [xs[u], ys[v], acc[u * 8 + v]])
    return acc


def _quads(b, smem, here, col, elem) -> list[ir.Value]:
    """The 8 values at col and col + 64 of a slice row (two 16-byte shared loads)."""
    out = []
    for half in (0, HALF):
        ptr = X.shared_element(b, smem, b.add(here, b.add(col, i32(half))))
        out += load_vector(b, ptr, elem)
    return out
