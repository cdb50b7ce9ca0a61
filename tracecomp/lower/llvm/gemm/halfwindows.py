"""Implicit GEMM's B panel packed from a bfloat16/float16 input (a convolution of half
tensors on a half path: schedule/tiles.py's half_path).

`pack_half_windows_function(module, dtype, width, layout, k_step)` defines
`pack(dst, src, rows, cols, count, kc)`, microkernel.pack_windows' contract (element (p, x)
of the window matrix is src[rows[p] + cols[x]], i32 offset tables, x < count, p < kc) over
an i16 source, writing the layout the path's micro-kernel reads (llvm/gemm/halfpack.py):
- "widen": float32 micro-panels (pack_function's layout), converted while packing;
- "pairs": K-pairs of halfs per 32-bit lane (dpbf16ps; AMX's B with k_step 32, zero-padded
  to a multiple of k_step deep).
Per micro-panel, the row of `width` halfs at depth p is one vector load when the column
offsets are consecutive (the columns of one output row, stride 1), two loads and a select
when they are two such runs (across the end of an output row), element by element
otherwise (strides, a last partial panel); rows at p >= kc are zeros and never read.
"""
from __future__ import annotations

import functools

import llvmlite.ir as ir

from ....core.dtypes import DType
from ....core.errors import BackendError
from .. import halfs
from .. import scalar as S
from ..loop_hints import plain_loop
from .microkernel import helper_function, splat

_PTR = ir.PointerType()
LAYOUTS = ("widen", "pairs")
c64 = functools.partial(ir.Constant, S.I64)
c32 = functools.partial(ir.Constant, S.I32)


def pack_half_windows_name(dtype: DType, width: int, layout: str, k_step: int = 1) -> str:
    return f"tracecomp.matmul.pack_windows.{dtype.label}.{layout}.{width}" + (f".k{k_step}" if k_step > 1 else "")


def pack_half_windows_function(module: ir.Module, dtype: DType, width: int, layout: str,
                               k_step: int = 1) -> ir.Function:
    if layout not in LAYOUTS:
        raise BackendError(f"pack_half_windows_function: layout {layout!r} is not one of {LAYOUTS}")
    fn, b = helper_function(module, dtype, pack_half_windows_name(dtype, width, layout, k_step),
                            [("dst", _PTR), ("src", _PTR), ("rows", _PTR), ("cols", _PTR), ("count", S.I64),
                             ("kc", S.I64)])
    if b is None:
        return fn
    _Packer(b, fn.args, dtype, width, layout, k_step).emit()
    b.ret_void()
    return fn


class _Packer:
    def __init__(self, b: ir.IRBuilder, args, dtype: DType, width: int, layout: str, k_step: int):
        self.b, self.dtype, self.width, self.layout, self.k_step = b, dtype, width, layout, k_step
        self.dst, self.src, self.rows, self.cols, self.count, self.kc = args
        self.it, self.ht = ir.VectorType(S.I32, width), ir.VectorType(S.I16, width)
        self.ramp = ir.Constant(self.it, list(range(width)))

    def depth(self) -> ir.Value:
        """Float32 slots per row of a micro-panel (the nest's spacing: Tiles.panel_depth)."""
        b, kc = self.b, self.kc
        if self.k_step == 1:
            return kc
        return b.udiv(self._padded(), c64(2))

    def _padded(self) -> ir.Value:
        b = self.b
        return b.mul(b.udiv(b.add(self.kc, c64(self.k_step - 1)), c64(self.k_step)), c64(self.k_step))

    def emit(self) -> None:
        b, w = self.b, self.width
        masked_load = S.declare(b.module, f"llvm.masked.load.v{w}i32.p0", self.it,
                                [_PTR, S.I32, ir.VectorType(S.I1, w), self.it])
        with plain_loop(b, c64(0), b.udiv(b.add(self.count, c64(w - 1)), c64(w)), "q") as q:
            x0 = b.mul(q.index, c64(w))
            valid = S.intrinsic(b, "smin", [c64(w), b.sub(self.count, x0)])
            mask = b.icmp_signed("<", self.ramp, splat(b, b.trunc(valid, S.I32), self.it))
            offsets = b.call(masked_load, [b.gep(self.cols, [x0], source_etype=S.I32), c32(4), mask,
                                           ir.Constant(self.it, [0] * w)])
            pdst = b.gep(self.dst, [b.mul(x0, self.depth())], source_etype=S.F32)
            self.panel(pdst, offsets, b.icmp_signed("==", valid, c64(w)), mask)

    def every(self, flags: ir.Value) -> ir.Value:
        t = ir.IntType(self.width)
        return self.b.icmp_unsigned("==", self.b.bitcast(flags, t), ir.Constant(t, -1))

    def panel(self, pdst, offsets, full, mask) -> None:
        """One micro-panel, by the first way of reading its rows that applies."""
        b, it = self.b, self.it
        first = b.extract_element(offsets, c32(0))
        steps = b.icmp_signed("==", offsets, b.add(splat(b, first, it), self.ramp))
        # two runs: the first lane that breaks the run starts the second, read shifted back
        # by its lane number; both loads stay between two elements of the panel
        split = b.zext(S.intrinsic(b, "cttz", [b.not_(b.bitcast(steps, ir.IntType(self.width)))],
                                   (ir.Constant(S.I1, 0),)), S.I32)
        second = b.sub(b.extract_element(offsets, S.intrinsic(b, "smin", [split, c32(self.width - 1)])), split)
        in_first = b.icmp_signed("<", self.ramp, splat(b, split, it))
        expected = b.add(b.select(in_first, splat(b, first, it), splat(b, second, it)), self.ramp)
        two = b.and_(b.and_(self.every(b.icmp_signed("==", offsets, expected)), full),
                     b.icmp_signed(">=", second, first))

        def load(row, at):
            return b.load(b.gep(self.src, [b.add(row, b.sext(at, S.I64))], source_etype=S.I16), typ=self.ht, align=2)

        def elements(row):
            out = ir.Constant(self.ht, [0] * self.width)
            for x in range(self.width):
                inside = b.extract_element(mask, c32(x))
                at = b.select(inside, b.add(row, b.sext(b.extract_element(offsets, c32(x)), S.I64)), c64(0))
                bits = b.select(inside, b.load(b.gep(self.src, [at], source_etype=S.I16), typ=S.I16),
                                ir.Constant(S.I16, 0))
                out = b.insert_element(out, bits, c32(x))
            return out
        cases = [(b.and_(self.every(steps), full), lambda row: load(row, first)),
                 (two, lambda row: b.select(in_first, load(row, first), load(row, second)))]

        def first_that_holds(cases):
            if not cases:
                self.each_row(pdst, elements)
                return
            (holds, read), rest = cases[0], cases[1:]
            with b.if_else(holds) as (yes, no):
                with yes:
                    self.each_row(pdst, read)
                with no:
                    first_that_holds(rest)
        first_that_holds(cases)

    def row_at(self, read, p: ir.Value, bounded: bool) -> ir.Value:
        """The panel's halfs at depth p (`read(row offset)`), zeros where p >= kc (the
        offset table is not read there) unless `bounded` (p < kc known)."""
        b = self.b
        if bounded:
            return read(b.sext(b.load(b.gep(self.rows, [p], source_etype=S.I32), typ=S.I32), S.I64))
        inside = b.icmp_signed("<", p, self.kc)
        with b.if_else(inside) as (yes, no):
            with yes:
                got = read(b.sext(b.load(b.gep(self.rows, [p], source_etype=S.I32), typ=S.I32), S.I64))
                here = b.block
            with no:
                there = b.block
        phi = b.phi(self.ht)
        phi.add_incoming(got, here)
        phi.add_incoming(ir.Constant(self.ht, [0] * self.width), there)
        return phi

    def each_row(self, pdst, read) -> None:
        b, w = self.b, self.width
        if self.layout == "widen":
            with plain_loop(b, c64(0), self.kc, "p") as p:
                value = halfs.widen(b, self.row_at(read, p.index, True), self.dtype.label)
                b.store(value, b.gep(pdst, [b.mul(p.index, c64(w))], source_etype=S.F32), align=4)
            return
        interleave = ir.Constant(ir.VectorType(S.I32, 2 * w), [x // 2 + (x % 2) * w for x in range(2 * w)])
        pairs = b.udiv(b.add(self.kc, c64(1)), c64(2)) if self.k_step == 1 else self.depth()
        with plain_loop(b, c64(0), pairs, "pp") as pp:
            p = b.mul(pp.index, c64(2))
            both = b.shuffle_vector(self.row_at(read, p, False), self.row_at(read, b.add(p, c64(1)), False),
                                    interleave)
            b.store(both, b.gep(pdst, [b.mul(pp.index, c64(w))], source_etype=S.I32), align=4)
