"""The blocked loop nest of the packed matmul as one function per dtype and tile shape.

`nest_function(module, dtype)` defines (once per module, like the micro-kernel and the
packing functions of llvm/gemm/microkernel.py) the internal function

    void tracecomp.matmul.nest.<dtype>.<MR>x<NR>(
        ptr a, i64 rs_a, i64 cs_a, ptr b, i64 rs_b, i64 cs_b, ptr c, i64 rs_c, i64 cs_c,
        i64 m_lo, i64 m_hi, i64 n_lo, i64 n_hi, i64 k, i64 kc, i64 mc, i64 nc,
        ptr ws, i64 a_elements, i1 accumulate, ptr epilogue_whole, ptr epilogue_edge, ptr context,
        ptr b_rows, ptr b_cols, ptr b_packed)

running the GotoBLAS/BLIS loops over rows [m_lo, m_hi) and columns [n_lo, n_hi) of one
(batch) matrix, element (i, j) of a / b / c at i * rs + j * cs:
    for jc in n-range step nc:            pack B[p0:p0+kc, jc:jc+nc] into ws + a_elements
      for p0 in 0..k step kc:
        for ic in m-range step mc:        pack A[ic:ic+mc, p0:p0+kc] into ws
          for jr step NR, ir step MR:     micro-kernel, then (last K-block) the epilogue
Full tiles (and unit column stride in C) go straight into C; the others through a stack
tile that `merge` copies out.  After the last K-block the tile's epilogue runs while the
tile is in L1: `epilogue_whole(context, i0, j0, MR, NR)` for full tiles,
`epilogue_edge(context, i0, j0, mr, nr)` for the others, skipped when null.  The caller
(llvm/gemm/matmul.py) supplies the epilogues and their context (the kernel's buffers, sizes and
visible names).  With b_rows non-null, B is a convolution's window matrix read in place
(implicit GEMM): element (p, j) is b[b_rows[p] + b_cols[j]] (i32 offset tables), packed
by pack_windows instead of from rs_b and cs_b (a half input's by halfwindows.py, in
pack_b's layout: K-pairs or widened).  With b_packed non-null, B was packed whole
before the call (a PackB statement: micro-panel q of NR columns at q * NR * k, each all k
rows deep), so no B panel is packed: the block (jc, p0) starts at b_packed + jc * k + p0 * NR
and its micro-panels lie k * NR apart (n_lo is a multiple of NR: items are whole tiles).

Why one function with run-time sizes rather than a copy per product with constant ones:
every copy costs its own LLVM time (5 nested loops through the whole pass pipeline, for
each product of W4's train step); the loops run once per block or tile, so constants in them
gained nothing measurable.
"""
from __future__ import annotations

from typing import Iterable

import llvmlite.ir as ir

from ....core.dtypes import DType
from .. import scalar as S
from ..emitter import counted_loop
from .microkernel import (defining_exported_helpers, helper_function, leaf_helper_names, merge_function, microkernel, pack_function,
                          pack_windows_function)
from .amx import amx_microkernel, configure_tiles, release_tiles
from .halfpack import dpbf16_microkernel, pack_pairs_function, pack_rows_function, pack_widen_function
from .halfwindows import pack_half_windows_function
from ...schedule.tiles import AMX_PATHS, PACKED_DTYPES, half_path, product_tiles, tiles_for

_PTR = ir.PointerType()
EPILOGUE_TYPE = ir.FunctionType(ir.VoidType(), [_PTR, S.I64, S.I64, S.I64, S.I64])
EPILOGUE_PTR = ir.PointerType(EPILOGUE_TYPE)      # prints as `ptr`; llvmlite needs the type to call
NEST_ARGS = [("a", _PTR), ("rs_a", S.I64), ("cs_a", S.I64), ("b", _PTR), ("rs_b", S.I64), ("cs_b", S.I64),
             ("c", _PTR), ("rs_c", S.I64), ("cs_c", S.I64), ("m_lo", S.I64), ("m_hi", S.I64),
             ("n_lo", S.I64), ("n_hi", S.I64), ("k", S.I64), ("kc", S.I64), ("mc", S.I64), ("nc", S.I64),
             ("ws", _PTR), ("a_elements", S.I64), ("accumulate", S.I1), ("epilogue_whole", EPILOGUE_PTR),
             ("epilogue_edge", EPILOGUE_PTR), ("context", _PTR), ("b_rows", _PTR), ("b_cols", _PTR),
             ("b_packed", _PTR)]


def define_helpers(module: ir.Module, dtypes: Iterable[DType]) -> list[str]:
    """Define the loop nest and every helper it calls for each of `dtypes` in `module`, with
    external linkage (also those it only declares), for the other objects of its library
    (compile_worker.py); returns their names."""
    dtypes = [d for d in dtypes if d in PACKED_DTYPES]
    with defining_exported_helpers():
        for dtype in dtypes:
            nest_function(module, dtype)
    return helper_names(dtypes)


def helper_names(dtypes: Iterable[DType]) -> list[str]:
    """The functions define_helpers defines for `dtypes`."""
    return sorted({name for d in dtypes if d in PACKED_DTYPES for name in [nest_name(d), *leaf_helper_names(d)]})


def nest_name(dtype: DType, a: DType | None = None, b: DType | None = None) -> str:
    """The nest's name; a product of half operands `a`, `b` (into float32) names them and
    its path (schedule/tiles.py: half_path)."""
    if (a or dtype) is dtype and (b or dtype) is dtype:
        t = tiles_for(dtype)
        return f"tracecomp.matmul.nest.{dtype.label}.{t.mr}x{t.nr}"
    t = product_tiles(dtype, (a, b))
    return f"tracecomp.matmul.nest.{dtype.label}.{a.label}.{b.label}.{half_path(a, b)}.{t.mr}x{t.nr}"


def nest_function(module: ir.Module, dtype: DType, a: DType | None = None, b: DType | None = None) -> ir.Function:
    """The nest of a product into `dtype` of operands of dtypes `a` and `b` (default: dtype).
    A nest with half operands is keyed by its half dtype (microkernel.helper_function): each
    module defines its own, while the f32 helpers it calls may live elsewhere."""
    a, b = a or dtype, b or dtype
    key = next((d for d in (a, b) if d.is_half), dtype)
    fn, builder = helper_function(module, key, nest_name(dtype, a, b), NEST_ARGS)
    if builder is not None:
        nest = _Nest(fn, builder, dtype, a, b)
        if nest.amx:            # one tile configuration for all the call's tiles
            configure_tiles(builder)
        nest.emit()
        if nest.amx:
            release_tiles(builder)
        builder.ret_void()
    return fn


def _packer(module: ir.Module, dtype: DType, source: DType, width: int, pairs: bool) -> ir.Function:
    """The packing function of an operand of dtype `source` into a `dtype` product, as
    K-pairs for the dpbf16ps micro-kernel (`pairs`: both operands bf16) or as `dtype`."""
    if pairs:
        return pack_pairs_function(module, width)
    return pack_function(module, dtype, width) if source is dtype else pack_widen_function(module, source, width)


class _Nest:
    def __init__(self, fn: ir.Function, b: ir.IRBuilder, dtype: DType, a: DType, b_dtype: DType):
        self.b, self.dtype, self.tiles = b, dtype, product_tiles(dtype, (a, b_dtype))
        self.t = S.register_type(dtype)
        self.elements = {"a": S.memory_type(a), "b": S.memory_type(b_dtype), "c": self.t}
        self.arg = {name: arg for (name, _), arg in zip(NEST_ARGS, fn.args)}
        module, tiles = fn.module, self.tiles
        half = a is not dtype or b_dtype is not dtype
        path = half_path(a, b_dtype) if half else None
        self.amx = path in AMX_PATHS
        pairs = path == "dpbf16ps"
        if self.amx:        # A as rows of K, B as K-pairs, both padded to the tile product's K step
            self.kernel = amx_microkernel(module, a)
            self.pack_a = pack_rows_function(module, a, tiles.mr, tiles.k_step)
            self.pack_b = pack_pairs_function(module, tiles.nr, b_dtype, tiles.k_step)
        else:
            self.kernel = dpbf16_microkernel(module, tiles.mr, tiles.nv) if pairs else \
                microkernel(module, dtype, tiles.mr, tiles.nv)
            self.pack_a = _packer(module, dtype, a, tiles.mr, pairs)
            self.pack_b = _packer(module, dtype, b_dtype, tiles.nr, pairs)
        if b_dtype is dtype:
            self.pack_windows = pack_windows_function(module, dtype, tiles.nr)
        else:               # a half input's windows, in the layout of pack_b
            self.pack_windows = pack_half_windows_function(module, b_dtype, tiles.nr, "pairs" if pairs or self.amx
                                                           else "widen", tiles.k_step)
        self.merge = merge_function(module, dtype, tiles.nr, a if self.amx else None)
        self.tile = b.alloca(ir.ArrayType(self.t, tiles.mr * tiles.nr), name="tile")
        self.tile.align = 64
        self.a_pack = self.arg["ws"]
        self.b_pack = self.gep(self.arg["ws"], self.arg["a_elements"])

    def c64(self, v: int) -> ir.Constant:
        return ir.Constant(S.I64, v)

    def gep(self, ptr: ir.Value, offset: ir.Value) -> ir.Value:
        return self.b.gep(ptr, [offset], source_etype=self.t)

    def at(self, role: str, i: ir.Value, j: ir.Value) -> ir.Value:
        """Address of element (i, j) of operand `role` (a, b or c)."""
        b = self.b
        return b.gep(self.arg[role], [b.add(b.mul(i, self.arg[f"rs_{role}"]), b.mul(j, self.arg[f"cs_{role}"]))],
                     source_etype=self.elements[role])

    def panel_depth(self, kc: ir.Value) -> ir.Value:
        """Workspace elements per row of a micro-panel kc deep (schedule/tiles.py:
        Tiles.panel_depth): kc, or for AMX kc padded to the K step, two halfs per slot."""
        t = self.tiles
        if t.k_step == 1 and t.k_per_slot == 1:
            return kc
        b = self.b
        padded = b.mul(b.udiv(b.add(kc, self.c64(t.k_step - 1)), self.c64(t.k_step)), self.c64(t.k_step))
        return b.udiv(padded, self.c64(t.k_per_slot))

    def blocks_of(self, lo, hi, step: ir.Value, name: str):
        """A counted_loop over the blocks of [lo, hi), and the function giving a block's
        (start, length) from the loop's state."""
        b = self.b
        count = b.sdiv(b.add(b.sub(hi, lo), b.sub(step, self.c64(1))), step)

        def block(state):
            start = b.add(lo, b.mul(state.index, step))
            return start, S.intrinsic(b, "smin", [step, b.sub(hi, start)])
        return counted_loop(b, self.c64(0), count, name), block

    def emit(self) -> None:
        b, arg = self.b, self.arg
        k, kc = arg["k"], arg["kc"]
        k_blocks = b.sdiv(b.add(k, b.sub(kc, self.c64(1))), kc)
        jloop, jblock = self.blocks_of(arg["n_lo"], arg["n_hi"], arg["nc"], "mm.jc")
        with jloop as jstate:
            jc, nc = jblock(jstate)
            with counted_loop(b, self.c64(0), k_blocks, "mm.pc") as pstate:
                p0 = b.mul(pstate.index, kc)
                kcur = S.intrinsic(b, "smin", [kc, b.sub(k, p0)])
                if self.amx:        # (a PackB's f32 panels are not this layout: schedule/prepack.py)
                    self.pack_b_panel(p0, jc, nc, kcur)
                    b_block, panel_depth = self.b_pack, self.panel_depth(kcur)
                else:
                    prepacked = b.icmp_unsigned("!=", arg["b_packed"], ir.Constant(_PTR, None))
                    with b.if_then(b.not_(prepacked)):
                        self.pack_b_panel(p0, jc, nc, kcur)
                    packed_at = self.gep(arg["b_packed"], b.add(b.mul(jc, k), b.mul(p0, self.c64(self.tiles.nr))))
                    b_block = b.select(prepacked, packed_at, self.b_pack)
                    panel_depth = b.select(prepacked, k, kcur)      # elements between micro-panels / NR
                add = b.or_(b.icmp_signed(">", pstate.index, self.c64(0)), arg["accumulate"])
                last = b.icmp_signed("==", pstate.index, b.sub(k_blocks, self.c64(1)))
                iloop, iblock = self.blocks_of(arg["m_lo"], arg["m_hi"], arg["mc"], "mm.ic")
                with iloop as istate:
                    ic, mc = iblock(istate)
                    b.call(self.pack_a, [self.a_pack, self.at("a", ic, p0), mc, kcur, arg["rs_a"], arg["cs_a"]])
                    self.tile_loops(ic, mc, jc, nc, kcur, add, last, b_block, panel_depth)

    def pack_b_panel(self, p0, jc, nc, kcur) -> None:
        """B's panel into the workspace: from its window tables when given, else strided."""
        b, arg = self.b, self.arg

        def strided():
            b.call(self.pack_b, [self.b_pack, self.at("b", p0, jc), nc, kcur, arg["cs_b"], arg["rs_b"]])
        if self.pack_windows is None:
            strided()
            return
        windows = b.icmp_unsigned("!=", arg["b_rows"], ir.Constant(_PTR, None))
        with b.if_else(windows) as (implicit, other):
            with implicit:
                b.call(self.pack_windows, [self.b_pack, arg["b"], b.gep(arg["b_rows"], [p0], source_etype=S.I32),
                                           b.gep(arg["b_cols"], [jc], source_etype=S.I32), nc, kcur])
            with other:
                strided()

    def tile_loops(self, ic, mc, jc, nc, kc, add, last, b_block, panel_depth) -> None:
        b, tiles, arg = self.b, self.tiles, self.arg
        jloop, jtile = self.blocks_of(self.c64(0), nc, self.c64(tiles.nr), "mm.jr")
        with jloop as jstate:
            jr, nr = jtile(jstate)
            iloop, itile = self.blocks_of(self.c64(0), mc, self.c64(tiles.mr), "mm.ir")
            with iloop as istate:
                ir_, mr = itile(istate)
                a_panel = self.gep(self.a_pack, b.mul(ir_, self.panel_depth(kc)))
                b_panel = self.gep(b_block, b.mul(jr, panel_depth))
                i0, j0 = b.add(ic, ir_), b.add(jc, jr)
                c = self.at("c", i0, j0)
                full = b.and_(b.and_(b.icmp_signed("==", mr, self.c64(tiles.mr)),
                                     b.icmp_signed("==", nr, self.c64(tiles.nr))),
                              b.icmp_signed("==", arg["cs_c"], self.c64(1)))
                with b.if_else(full) as (whole, edge):
                    with whole:
                        b.call(self.kernel, [kc, a_panel, b_panel, c, arg["rs_c"], add])
                        self.epilogue(last, "epilogue_whole", i0, j0, mr, nr)
                    with edge:
                        b.call(self.kernel, [kc, a_panel, b_panel, self.tile, self.c64(tiles.nr),
                                             ir.Constant(S.I1, 0)])
                        b.call(self.merge, [self.tile, c, mr, nr, arg["rs_c"], arg["cs_c"], add])
                        self.epilogue(last, "epilogue_edge", i0, j0, mr, nr)

    def epilogue(self, last: ir.Value, which: str, i0, j0, mr, nr) -> None:
        b, fn_ptr = self.b, self.arg[which]
        present = b.icmp_unsigned("!=", fn_ptr, ir.Constant(_PTR, None))
        with b.if_then(b.and_(last, present)):
            b.call(fn_ptr, [self.arg["context"], i0, j0, mr, nr])
