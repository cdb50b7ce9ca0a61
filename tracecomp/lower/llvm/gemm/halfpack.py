"""The packed matmul's helpers for bfloat16/float16 operands of a float32 product
(schedule/tiles.py: half_path picks the path).

- "widen": `pack_widen_function` packs a half panel as float32 micro-panels (pack_function's
  layout), converting while it copies (llvm/halfs.py: vcvtph2ps with F16C), and the f32
  micro-kernel runs: no float32 copy of the whole operand is ever made.
- "dpbf16ps" (AVX512-BF16): `pack_pairs_function` packs bfloat16 panels as K-pairs, step pp
  of a micro-panel holding `width` 32-bit lanes, lane x = (element (x, 2pp), element
  (x, 2pp + 1)); an odd depth pads the last pair with zero.  `dpbf16_microkernel` then
  issues one vdpbf16ps per B vector and A row per pair (two products per float32 lane,
  accumulated in float32: the bf16 products are exact in float32, so only the sums round).
  A micro-panel of width w and depth kc takes w * ceil(kc / 2) lanes, at most the w * kc
  float32 slots the nest spaces micro-panels by, so the nest addresses both paths alike.
- "amx", "amx-fp16" (llvm/gemm/amx.py): B as the same K-pairs (`pack_pairs_function` with
  k_step 32), A as rows of K (`pack_rows_function`), both zero-padded to a multiple of 32
  deep; a micro-panel of width w then takes w * ceil(kc / 32) * 16 float32 slots
  (schedule/tiles.py: Tiles.panel_depth), by which the nest spaces them.
"""
from __future__ import annotations

import functools

import llvmlite.ir as ir

from ....core.dtypes import DType
from .. import halfs
from .. import scalar as S
from ..loop_hints import plain_loop
from ...schedule.tiles import tiles_for
from .microkernel import helper_function, prefetch_tile, splat, steps_of, store_tile, transpose

_PTR = ir.PointerType()
F32 = DType.float32
DPBF16PS = {16: "llvm.x86.avx512bf16.dpbf16ps.512", 8: "llvm.x86.avx512bf16.dpbf16ps.256"}    # by f32 lanes
c64 = functools.partial(ir.Constant, S.I64)


class BFloatType(ir.Type):
    """LLVM's `bfloat` (llvmlite has no such type): only the intrinsic's operands use it."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, BFloatType)

    def __hash__(self) -> int:
        return hash("bfloat")


def pack_widen_name(src: DType, width: int) -> str:
    return f"tracecomp.matmul.pack_widen.{src.label}.{width}"


def pack_pairs_name(width: int, dtype: DType = DType.bfloat16, k_step: int = 1) -> str:
    return f"tracecomp.matmul.pack_pairs.{dtype.label}.{width}" + (f".k{k_step}" if k_step > 1 else "")


def pack_rows_name(dtype: DType, width: int, k_step: int) -> str:
    return f"tracecomp.matmul.pack_rows.{dtype.label}.{width}.k{k_step}"


def _padded(b: ir.IRBuilder, kc: ir.Value, k_step: int) -> ir.Value:
    """kc rounded up to a multiple of k_step."""
    return b.mul(b.udiv(b.add(kc, c64(k_step - 1)), c64(k_step)), c64(k_step))


def _pack_panels(module: ir.Module, src_dtype: DType, name: str, width: int, whole_paths, element,
                 k_step: int = 1) -> ir.Function:
    """`name(dst, src, count, kc, sx, sp)`, pack_function's signature over a half source
    (element (x, p) at src[x * sx + p * sp]): per micro-panel q of `width` rows (at dst + q *
    width * D float32 slots, D = kc, or with k_step > 1 kc padded to it, halved: two halfs
    per slot), the first of `whole_paths` [(stride that must be 1, fill)] that applies to a
    whole panel, else `element(pdst, psrc, kc, sx, sp, valid)`."""
    fn, b = helper_function(module, src_dtype, name, [("dst", _PTR), ("src", _PTR), ("count", S.I64),
                                                     ("kc", S.I64), ("sx", S.I64), ("sp", S.I64)])
    if b is None:
        return fn
    dst, src, count, kc, sx, sp = fn.args
    strides = {"sx": sx, "sp": sp}
    w = c64(width)
    depth = kc if k_step == 1 else b.udiv(_padded(b, kc, k_step), c64(2))
    with plain_loop(b, c64(0), b.udiv(b.add(count, c64(width - 1)), w), "q") as q:
        x0 = b.mul(q.index, w)
        valid = S.intrinsic(b, "smin", [w, b.sub(count, x0)])
        pdst = b.gep(dst, [b.mul(x0, depth)], source_etype=S.F32)
        psrc = b.gep(src, [b.mul(x0, sx)], source_etype=S.I16)

        def first(paths):
            if not paths:
                element(b, pdst, psrc, kc, sx, sp, valid)
                return
            (unit, fill), rest = paths[0], paths[1:]
            fits = b.and_(b.icmp_signed("==", valid, w), b.icmp_signed("==", strides[unit], c64(1)))
            with b.if_else(fits) as (yes, no):
                with yes:
                    fill(b, pdst, psrc, kc, sx, sp)
                with no:
                    first(rest)
        first(list(whole_paths))
    b.ret_void()
    return fn


def _half_at(b: ir.IRBuilder, psrc, x, p, sx, sp, inside) -> ir.Value:
    """The i16 of element (x, p), 0 where not `inside` (its address is then not read)."""
    at = b.select(inside, b.add(b.mul(x, sx), b.mul(p, sp)), c64(0))
    return b.select(inside, b.load(b.gep(psrc, [at], source_etype=S.I16), typ=S.I16), ir.Constant(S.I16, 0))


def pack_widen_function(module: ir.Module, src: DType, width: int) -> ir.Function:
    """Half panel -> float32 micro-panels: a vector load and conversion per p when the
    panel's rows are contiguous (B row-major), element by element otherwise."""
    label = src.label

    def rows(b, pdst, psrc, kc, sx, sp):
        with plain_loop(b, c64(0), kc, "p") as p:
            bits = b.load(b.gep(psrc, [b.mul(p.index, sp)], source_etype=S.I16), typ=ir.VectorType(S.I16, width),
                          align=2)
            b.store(halfs.widen(b, bits, label), b.gep(pdst, [b.mul(p.index, c64(width))], source_etype=S.F32),
                    align=4)

    def elements(b, pdst, psrc, kc, sx, sp, valid):
        with plain_loop(b, c64(0), kc, "p") as p:
            with plain_loop(b, c64(0), c64(width), "x") as x:
                bits = _half_at(b, psrc, x.index, p.index, sx, sp, b.icmp_signed("<", x.index, valid))
                b.store(halfs.widen(b, bits, label),
                        b.gep(pdst, [b.add(b.mul(p.index, c64(width)), x.index)], source_etype=S.F32))
    return _pack_panels(module, src, pack_widen_name(src, width), width, [("sx", rows)], elements)


def pack_pairs_function(module: ir.Module, width: int, dtype: DType = DType.bfloat16, k_step: int = 1) -> ir.Function:
    """Half panel -> K-pair micro-panels (module docstring); with k_step > 1 (AMX) each
    micro-panel is zero-padded to ceil(kc / k_step) * k_step / 2 pairs.  Rows contiguous (B
    row-major): two vector loads and an interleave per pair.  Depth contiguous (A
    row-major): one 32-bit load per lane and pair.  Else element by element."""
    interleave = ir.Constant(ir.VectorType(S.I32, 2 * width), [x // 2 + (x % 2) * width for x in range(2 * width)])

    def pairs(b, kc):
        return _pairs(b, kc) if k_step == 1 else b.udiv(_padded(b, kc, k_step), c64(2))

    def lane(b, pdst, pp, x):
        return b.gep(pdst, [b.add(b.mul(pp, c64(width)), x)], source_etype=S.I32)

    def rows(b, pdst, psrc, kc, sx, sp):
        vt = ir.VectorType(S.I16, width)

        def row(p):
            inside = b.icmp_signed("<", p, kc)
            at = b.gep(psrc, [b.mul(b.select(inside, p, c64(0)), sp)], source_etype=S.I16)
            return b.select(inside, b.load(at, typ=vt, align=2), ir.Constant(vt, [0] * width))
        with plain_loop(b, c64(0), pairs(b, kc), "pp") as pp:
            p = b.mul(pp.index, c64(2))
            both = b.shuffle_vector(row(p), row(b.add(p, c64(1))), interleave)
            b.store(both, lane(b, pdst, pp.index, c64(0)), align=4)

    def depth(b, pdst, psrc, kc, sx, sp):
        whole = b.udiv(kc, c64(2))
        with plain_loop(b, c64(0), whole, "pp") as pp:
            with plain_loop(b, c64(0), c64(width), "x") as x:
                at = b.gep(psrc, [b.add(b.mul(x.index, sx), b.mul(pp.index, c64(2)))], source_etype=S.I16)
                b.store(b.load(at, typ=S.I32, align=2), lane(b, pdst, pp.index, x.index))
        odd = b.icmp_signed("!=", b.mul(whole, c64(2)), kc)
        with b.if_then(odd):
            with plain_loop(b, c64(0), c64(width), "x") as x:
                last = b.load(b.gep(psrc, [b.add(b.mul(x.index, sx), b.sub(kc, c64(1)))], source_etype=S.I16), typ=S.I16)
                b.store(b.zext(last, S.I32), lane(b, pdst, whole, x.index))
        if k_step > 1:          # the padding pairs
            zeros = ir.Constant(ir.VectorType(S.I32, width), [0] * width)
            with plain_loop(b, _pairs(b, kc), pairs(b, kc), "pz") as pp:
                b.store(zeros, lane(b, pdst, pp.index, c64(0)), align=4)

    def elements(b, pdst, psrc, kc, sx, sp, valid):
        with plain_loop(b, c64(0), pairs(b, kc), "pp") as pp:
            with plain_loop(b, c64(0), c64(width), "x") as x:
                inside = b.icmp_signed("<", x.index, valid)
                halves = []
                for h in (0, 1):
                    p = b.add(b.mul(pp.index, c64(2)), c64(h))
                    bits = _half_at(b, psrc, x.index, p, sx, sp, b.and_(inside, b.icmp_signed("<", p, kc)))
                    halves.append(b.zext(bits, S.I32))
                b.store(b.or_(halves[0], b.shl(halves[1], ir.Constant(S.I32, 16))), lane(b, pdst, pp.index, x.index))
    return _pack_panels(module, dtype, pack_pairs_name(width, dtype, k_step), width, [("sx", rows), ("sp", depth)],
                        elements, k_step)


def pack_rows_function(module: ir.Module, dtype: DType, width: int, k_step: int) -> ir.Function:
    """Half panel -> micro-panels of `width` rows of K (AMX's A tiles): row x of a panel at
    x * D halfs, D = kc padded to k_step with zeros, rows past the panel's valid ones zero.
    Depth contiguous (A row-major): masked k_step-wide vector loads.  Rows contiguous (A
    transposed, a weight gradient's x.mT): square blocks transposed in registers.  Else
    element by element."""
    vt = ir.VectorType(S.I16, k_step)
    zeros = ir.Constant(vt, [0] * k_step)
    ramp = ir.Constant(ir.VectorType(S.I64, k_step), list(range(k_step)))
    masked_load = S.declare(module, f"llvm.masked.load.v{k_step}i16.p0", vt,
                            [_PTR, S.I32, ir.VectorType(S.I1, k_step), vt])

    def row_at(b, pdst, kc, x):
        return b.gep(pdst, [b.mul(x, _padded(b, kc, k_step))], source_etype=S.I16)

    def depth(b, pdst, psrc, kc, sx, sp):
        with plain_loop(b, c64(0), c64(width), "x") as x:
            src_row, dst_row = b.gep(psrc, [b.mul(x.index, sx)], source_etype=S.I16), row_at(b, pdst, kc, x.index)
            with plain_loop(b, c64(0), b.udiv(_padded(b, kc, k_step), c64(k_step)), "ks") as ks:
                p0 = b.mul(ks.index, c64(k_step))
                mask = b.icmp_signed("<", b.add(ramp, splat(b, p0, ramp.type)), splat(b, kc, ramp.type))
                chunk = b.call(masked_load, [b.gep(src_row, [p0], source_etype=S.I16), ir.Constant(S.I32, 2), mask,
                                             zeros])
                b.store(chunk, b.gep(dst_row, [p0], source_etype=S.I16), align=2)

    def across(b, pdst, psrc, kc, sx, sp):
        block = transpose_halfs_function(module, dtype, width)
        with plain_loop(b, c64(0), b.udiv(_padded(b, kc, k_step), c64(k_step)), "ks") as ks:
            p0 = b.mul(ks.index, c64(k_step))
            b.call(block, [b.gep(pdst, [p0], source_etype=S.I16), b.gep(psrc, [b.mul(p0, sp)], source_etype=S.I16),
                           sp, _padded(b, kc, k_step), b.sub(kc, p0)])

    def elements(b, pdst, psrc, kc, sx, sp, valid):
        with plain_loop(b, c64(0), c64(width), "x") as x:
            dst_row = row_at(b, pdst, kc, x.index)
            with plain_loop(b, c64(0), _padded(b, kc, k_step), "p") as p:
                inside = b.and_(b.icmp_signed("<", x.index, valid), b.icmp_signed("<", p.index, kc))
                b.store(_half_at(b, psrc, x.index, p.index, sx, sp, inside), b.gep(dst_row, [p.index], source_etype=S.I16))
    whole = [("sp", depth)] + ([("sx", across)] if width == k_step else [])
    return _pack_panels(module, dtype, pack_rows_name(dtype, width, k_step), width, whole, elements, k_step)


def transpose_halfs_name(dtype: DType, v: int) -> str:
    return f"tracecomp.matmul.transpose_halfs.{dtype.label}.{v}"


def transpose_halfs_function(module: ir.Module, dtype: DType, v: int) -> ir.Function:
    """`transpose(dst, src, sp, ld, depth)`: dst[x * ld + p] = src[p * sp + x] for x, p < V,
    zero where p >= depth (those rows of src are not read): V vector loads, a transpose in
    registers (microkernel.transpose), V vector stores.  A function of its own, for the
    reason microkernel.transpose_function gives."""
    vt = ir.VectorType(S.I16, v)
    fn, b = helper_function(module, dtype, transpose_halfs_name(dtype, v),
                            [("dst", _PTR), ("src", _PTR), ("sp", S.I64), ("ld", S.I64), ("depth", S.I64)])
    if b is None:
        return fn
    dst, src, sp, ld, depth = fn.args
    rows = []
    for p in range(v):
        inside = b.icmp_signed(">", depth, c64(p))
        at = b.gep(src, [b.select(inside, b.mul(c64(p), sp), c64(0))], source_etype=S.I16)
        rows.append(b.select(inside, b.load(at, typ=vt, align=2), ir.Constant(vt, [0] * v)))
    for x, column in enumerate(transpose(b, rows)):
        b.store(column, b.gep(dst, [b.mul(c64(x), ld)], source_etype=S.I16), align=2)
    b.ret_void()
    return fn


def _pairs(b: ir.IRBuilder, kc: ir.Value) -> ir.Value:
    return b.udiv(b.add(kc, c64(1)), c64(2))


def dpbf16_microkernel_name(mr: int, nv: int) -> str:
    return f"tracecomp.matmul.uk.dpbf16ps.{mr}x{nv * tiles_for(F32).lanes}"


def dpbf16_microkernel(module: ir.Module, mr: int, nv: int) -> ir.Function:
    """The MR x (nv * L) float32 tile from K-pair micro-panels (microkernel's signature and
    contract, kc counting elements; L = 16 or, with 256-bit vectors chosen, 8 lanes): per
    pair, nv B vectors, and for each of the MR rows its A lane broadcast and nv vdpbf16ps."""
    lanes = tiles_for(F32).lanes
    vt, it = ir.VectorType(S.F32, lanes), ir.VectorType(S.I32, lanes)
    bt = ir.VectorType(BFloatType(), 2 * lanes)
    fn, b = helper_function(module, DType.bfloat16, dpbf16_microkernel_name(mr, nv),
                             [("kc", S.I64), ("a", _PTR), ("b", _PTR), ("c", _PTR), ("ldc", S.I64), ("add", S.I1)])
    fn.args[2].attributes.align = 64
    if b is None:
        return fn
    kc, a, bp, c, ldc, add = fn.args
    dot = S.declare(module, DPBF16PS[lanes], vt, [vt, bt, bt])
    prefetch_tile(b, c, ldc, mr, nv * lanes * 4, S.F32)

    def step(accs, pp):
        a_row = b.gep(a, [b.mul(pp, c64(mr))], source_etype=S.I32)
        b_row = b.gep(bp, [b.mul(pp, c64(nv * lanes))], source_etype=S.I32)
        bv = [b.bitcast(b.load(b.gep(b_row, [c64(v * lanes)], source_etype=S.I32), typ=it, align=4 * lanes), bt)
              for v in range(nv)]
        out = list(accs)
        for r in range(mr):
            x = b.bitcast(splat(b, b.load(b.gep(a_row, [c64(r)], source_etype=S.I32), typ=S.I32), it), bt)
            for v in range(nv):
                out[r * nv + v] = b.call(dot, [out[r * nv + v], x, bv[v]])
        return out
    accs = steps_of(b, _pairs(b, kc), [ir.Constant(vt, None)] * (mr * nv), step)
    store_tile(b, accs, c, ldc, add, mr, nv, F32)
    b.ret_void()
    return fn
