"""The matmul micro-kernel: one MR x NR register tile of C from packed panels, in LLVM IR.

`microkernel(module, dtype, mr, nv)` defines (once per module) the function

    void tracecomp.matmul.uk.<f32|f64>.<MR>x<NR>(i64 kc, ptr a, ptr b, ptr c, i64 ldc, i1 add)

computing  c[r * ldc + j] (+)= sum_p a[p * MR + r] * b[p * NR + j]  for r < MR, j < NR, where
NR = nv * L and L is the target's vector width (schedule/tiles.py: 16 f32 / 8 f64 lanes
with AVX-512, half that with AVX2):
- `a` is a packed A micro-panel, MR consecutive elements per step p (one column of A's tile);
- `b` is a packed B micro-panel, NR consecutive elements per step p, 64-byte aligned;
- the MR * nv accumulators are `<L x T>` vectors carried through the p loop in registers;
  each step loads nv vectors of b, broadcasts each of the MR elements of a, and issues
  MR * nv `llvm.fma` calls (the broadcast folds into the FMA's memory operand on x86);
- `add` chooses between c = tile and c += tile (the K-blocks after the first accumulate).
The caller handles edges: it zero-pads partial panels, and for a partial (or non-unit
column stride) tile passes a stack tile as `c` and merges the valid part itself.
The p loop is unrolled by UNROLL with a remainder loop, so the loop overhead (one compare,
one branch, two pointer bumps) is paid once per UNROLL steps.  Before it, the C tile's
lines are prefetched for writing (PREFETCH_C): C is re-read once per K-block and would
otherwise stall the tile's stores (the gain: BENCHMARKS.md, "Figures that were in the code").

Also here: the packing functions that copy A and B panels into micro-panels (with
in-register transposes) and the merge of a partial tile into C.  LLVM leaves their loops
as written (llvm.loop_hints.plain_loop): they are vectorized by hand or run on edges only.

These helpers (and llvm/gemm/nest.py's loop nest) are internal functions of the module that
uses them.  A module compiled in parts on several processes (runtime/compile_worker.py)
compiles them once: inside `helpers_defined_elsewhere(dtypes)` the modules generated only
declare them, and llvm.gemm.nest.define_helpers defines them, external, in one module.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterable, Iterator, Optional

import llvmlite.ir as ir

from ....core.dtypes import DType
from .. import scalar as S
from ...schedule.tiles import tiles_for
from ..emitter import counted_loop
from ..loop_hints import plain_loop

UNROLL = 4
PREFETCH_C = True
_PTR = ir.PointerType()
# dtypes whose helpers the modules being generated only declare (another object of the
# same library defines them), and whether helpers defined now are external (exported to it)
_defined_elsewhere: contextvars.ContextVar[frozenset] = contextvars.ContextVar(
    "tracecomp_matmul_helpers_elsewhere", default=frozenset())
_exporting: contextvars.ContextVar[bool] = contextvars.ContextVar("tracecomp_matmul_helpers_exported",
                                                                  default=False)


@contextlib.contextmanager
def helpers_defined_elsewhere(dtypes: Iterable[DType]) -> Iterator[None]:
    """Inside: the helpers of `dtypes` (micro-kernel, packing, merge, loop nest) are
    declared, not defined, in the modules generated; llvm.gemm.nest.define_helpers
    defines them in one module."""
    token = _defined_elsewhere.set(frozenset(dtypes))
    try:
        yield
    finally:
        _defined_elsewhere.reset(token)


def defined_elsewhere_dtypes() -> frozenset:
    """The dtypes whose helpers are only declared here (see helpers_defined_elsewhere)."""
    return _defined_elsewhere.get()


@contextlib.contextmanager
def defining_exported_helpers() -> Iterator[None]:
    """Inside: helpers are defined (also those declared so far) with external linkage."""
    exporting, elsewhere = _exporting.set(True), _defined_elsewhere.set(frozenset())
    try:
        yield
    finally:
        _exporting.reset(exporting)
        _defined_elsewhere.reset(elsewhere)


def leaf_helper_names(dtype: DType) -> list[str]:
    """The micro-kernel, packing (and transposing) and merge functions of `dtype`'s tiles."""
    t = tiles_for(dtype)
    names = [microkernel_name(dtype, t.mr, t.nv), merge_name(dtype, t.nr), pack_windows_name(dtype, t.nr)]
    for width in (t.mr, t.nr):
        names.append(pack_name(dtype, width))
        if _transpose_block(width, dtype) > 1:
            names.append(transpose_name(dtype, _transpose_block(width, dtype)))
    return names


def vector_type(dtype: DType) -> ir.VectorType:
    return ir.VectorType(S.register_type(dtype), tiles_for(dtype).lanes)


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x * y + z on vectors, rounded once (`llvm.fma.v16f32` / `llvm.fma.v8f64`)."""
    t = x.type
    scalar = "f32" if t.element == S.F32 else "f64"
    fn = S.declare(b.module, f"llvm.fma.v{t.count}{scalar}", t, [t, t, t])
    return b.call(fn, [x, y, z])


def splat(b: ir.IRBuilder, x: ir.Value, t: ir.VectorType) -> ir.Value:
    one = b.insert_element(ir.Constant(t, ir.Undefined), x, ir.Constant(S.I32, 0))
    return b.shuffle_vector(one, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(S.I32, t.count), [0] * t.count))


def microkernel_name(dtype: DType, mr: int, nv: int) -> str:
    return f"tracecomp.matmul.uk.{_scalar_name(dtype)}.{mr}x{nv * tiles_for(dtype).lanes}"


def microkernel(module: ir.Module, dtype: DType, mr: int, nv: int) -> ir.Function:
    """The MR x (nv * L) micro-kernel for `dtype` (f32 or f64), defined on first use."""
    vt, lanes = vector_type(dtype), tiles_for(dtype).lanes
    fn, b = helper_function(module, dtype, microkernel_name(dtype, mr, nv),
                             [("kc", S.I64), ("a", _PTR), ("b", _PTR), ("c", _PTR), ("ldc", S.I64), ("add", S.I1)])
    fn.args[2].attributes.align = 64
    if b is None:
        return fn
    kc, a, bp, c, ldc, add = fn.args
    accs = [ir.Constant(vt, None)] * (mr * nv)
    t = S.register_type(dtype)
    if PREFETCH_C:
        prefetch_tile(b, c, ldc, mr, nv * lanes * dtype.itemsize, t)

    def step(accs, p):
        a_row = b.gep(a, [b.mul(p, ir.Constant(S.I64, mr))], source_etype=t)
        b_row = b.gep(bp, [b.mul(p, ir.Constant(S.I64, nv * lanes))], source_etype=t)
        bv = [b.load(b.gep(b_row, [ir.Constant(S.I64, v * lanes)], source_etype=t), typ=vt,
                     align=tiles_for(dtype).vector_bytes)
              for v in range(nv)]
        out = list(accs)
        for r in range(mr):
            x = splat(b, b.load(b.gep(a_row, [ir.Constant(S.I64, r)], source_etype=t), typ=t), vt)
            for v in range(nv):
                out[r * nv + v] = fma(b, x, bv[v], out[r * nv + v])
        return out

    store_tile(b, steps_of(b, kc, accs, step), c, ldc, add, mr, nv, dtype)
    b.ret_void()
    return fn


def steps_of(b: ir.IRBuilder, count: ir.Value, accs: list, step) -> list:
    """The accumulators after `accs = step(accs, p)` for p < count: UNROLL steps per
    iteration, then a remainder loop."""
    steps = b.udiv(count, ir.Constant(S.I64, UNROLL))
    with counted_loop(b, ir.Constant(S.I64, 0), steps, "p4", accs) as loop:
        p0 = b.mul(loop.index, ir.Constant(S.I64, UNROLL))
        cur = list(loop.carried)
        for u in range(UNROLL):
            cur = step(cur, b.add(p0, ir.Constant(S.I64, u)))
        loop.next = cur
    start = b.mul(steps, ir.Constant(S.I64, UNROLL))
    with counted_loop(b, start, count, "p", list(loop.carried)) as tail:
        tail.next = step(list(tail.carried), tail.index)
    return list(tail.carried)


def prefetch_tile(b: ir.IRBuilder, c: ir.Value, ldc: ir.Value, mr: int, row_bytes: int, t: ir.Type) -> None:
    """Ask for the C tile's cache lines (for writing) before the k loop, so that the
    stores at its end (and the loads when accumulating) find them in L1."""
    prefetch = S.declare(b.module, "llvm.prefetch.p0", ir.VoidType(), [_PTR, S.I32, S.I32, S.I32])
    for r in range(mr):
        row = b.gep(c, [b.mul(ldc, ir.Constant(S.I64, r))], source_etype=t)
        for line in range(0, row_bytes, 64):
            at = b.gep(row, [ir.Constant(S.I64, line)], source_etype=S.I8)
            b.call(prefetch, [at, ir.Constant(S.I32, 1), ir.Constant(S.I32, 3), ir.Constant(S.I32, 1)])


def store_tile(b: ir.IRBuilder, accs: list, c: ir.Value, ldc: ir.Value, add: ir.Value,
                mr: int, nv: int, dtype: DType) -> None:
    """Row r of the tile goes to c + r * ldc (unaligned: C is any strided view)."""
    vt, t, lanes, align = accs[0].type, S.register_type(dtype), tiles_for(dtype).lanes, dtype.itemsize
    ptrs = []
    for r in range(mr):
        row = b.gep(c, [b.mul(ldc, ir.Constant(S.I64, r))], source_etype=t)
        ptrs += [b.gep(row, [ir.Constant(S.I64, v * lanes)], source_etype=t) for v in range(nv)]
    with b.if_else(add) as (accumulate, overwrite):
        with accumulate:
            for acc, p in zip(accs, ptrs):
                b.store(b.fadd(b.load(p, typ=vt, align=align), acc), p, align=align)
        with overwrite:
            for acc, p in zip(accs, ptrs):
                b.store(acc, p, align=align)


def helper_function(module: ir.Module, dtype: DType, name: str,
                     args: list[tuple[str, ir.Type]]) -> tuple[ir.Function, Optional[ir.IRBuilder]]:
    """The helper `name` of `module` and a builder at its entry if its body is to be
    emitted now (else None: defined already, or declared for another object to define)."""
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [t for _, t in args]), name)
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        for arg, (arg_name, _) in zip(fn.args, args):
            arg.name = arg_name
            if isinstance(arg.type, ir.PointerType):
                arg.add_attribute("noalias")
    if fn.blocks or dtype in _defined_elsewhere.get():
        return fn, None
    fn.linkage = "external" if _exporting.get() else "internal"
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def pack_name(dtype: DType, width: int) -> str:
    return f"tracecomp.matmul.pack.{dtype.label}.{width}"


def pack_function(module: ir.Module, dtype: DType, width: int) -> ir.Function:
    """`pack(dst, src, count, kc, sx, sp)`: copy `count` rows x of a strided panel
    (element (x, p) at src[x * sx + p * sp], p < kc) into micro-panels of `width` rows:
    dst[q * width * kc + p * width + x % width] for q = x / width, zero-filling the rows
    of the last micro-panel past `count`.  Full micro-panels are copied with vectors:
    transposed in registers when the source runs along p (A row-major, B transposed),
    row by row when it runs along x (A transposed, B row-major)."""
    t = S.register_type(dtype)
    fn, b = helper_function(module, dtype, pack_name(dtype, width),
                             [("dst", _PTR), ("src", _PTR), ("count", S.I64), ("kc", S.I64),
                              ("sx", S.I64), ("sp", S.I64)])
    if b is None:
        return fn
    dst, src, count, kc, sx, sp = fn.args
    w, one = ir.Constant(S.I64, width), ir.Constant(S.I64, 1)
    panels = b.udiv(b.add(count, ir.Constant(S.I64, width - 1)), w)
    with plain_loop(b, ir.Constant(S.I64, 0), panels, "q") as q:
        x0 = b.mul(q.index, w)
        valid = S.intrinsic(b, "smin", [w, b.sub(count, x0)])
        pdst = b.gep(dst, [b.mul(x0, kc)], source_etype=t)
        psrc = b.gep(src, [b.mul(x0, sx)], source_etype=t)
        with b.if_else(b.icmp_signed("==", valid, w)) as (whole, part):
            with whole:
                with b.if_else(b.icmp_signed("==", sp, one)) as (along_p, other):
                    with along_p:
                        _pack_transposing(b, dtype, width, pdst, psrc, kc, sx)
                    with other:
                        with b.if_else(b.icmp_signed("==", sx, one)) as (along_x, strided):
                            with along_x:
                                _pack_rows(b, dtype, width, pdst, psrc, kc, sp)
                            with strided:
                                _pack_elements(b, dtype, width, pdst, psrc, kc, sx, sp, valid)
            with part:
                with b.if_else(b.icmp_signed("==", sx, one)) as (along_x, strided):
                    with along_x:
                        _pack_rows_masked(b, dtype, width, pdst, psrc, kc, sp, valid)
                    with strided:
                        _pack_elements(b, dtype, width, pdst, psrc, kc, sx, sp, valid)
    b.ret_void()
    return fn


def pack_windows_name(dtype: DType, width: int) -> str:
    return f"tracecomp.matmul.pack_windows.{dtype.label}.{width}"


def pack_windows_function(module: ir.Module, dtype: DType, width: int) -> ir.Function:
    """`pack_windows(dst, src, rows, cols, count, kc)`: pack_function's B panel when element
    (p, x) is src[rows[p] + cols[x]] (i32 offset tables; a convolution's window matrix read
    in the input: loops.ir.Windows), for x < count and p < kc.  Per vector of a micro-panel,
    its column offsets are loaded once: when they are consecutive (the columns of one output
    row, stride 1) each p is one vector load; when they are two such runs (a vector across
    the end of an output row) two loads and a blend; when they step by two (stride 2) two
    loads and a shuffle; otherwise a gather (which cost W7's conv a sixth of its time when it
    also took the two-run vectors); past `count` the lanes are zero."""
    t, lanes = S.register_type(dtype), tiles_for(dtype).lanes
    vt, it = ir.VectorType(t, lanes), ir.VectorType(S.I32, lanes)
    fn, b = helper_function(module, dtype, pack_windows_name(dtype, width),
                             [("dst", _PTR), ("src", _PTR), ("rows", _PTR), ("cols", _PTR), ("count", S.I64),
                              ("kc", S.I64)])
    if b is None:
        return fn
    dst, src, rows, cols, count, kc = fn.args
    c64 = functools.partial(ir.Constant, S.I64)
    ramp = ir.Constant(it, list(range(lanes)))
    ramp2 = ir.Constant(it, list(range(0, 2 * lanes, 2)))
    # the even positions of [first, first + 2 lanes - 1) from loads at first and first + lanes - 1
    evens_mask = ir.Constant(it, [2 * i if 2 * i < lanes else 2 * i + 1 for i in range(lanes)])
    masked_load = S.declare(module, f"llvm.masked.load.v{lanes}i32.p0", it, [_PTR, S.I32, ir.VectorType(S.I1, lanes), it])
    gather = S.declare(module, f"llvm.masked.gather.v{lanes}{_scalar_name(dtype)}.v{lanes}p0", vt,
                       [ir.VectorType(_PTR, lanes), S.I32, ir.VectorType(S.I1, lanes), vt])
    zeros = ir.Constant(vt, [0.0] * lanes)
    panels = b.udiv(b.add(count, c64(width - 1)), c64(width))
    with plain_loop(b, c64(0), panels, "q") as q:
        x0 = b.mul(q.index, c64(width))
        pdst = b.gep(dst, [b.mul(x0, kc)], source_etype=t)
        with plain_loop(b, c64(0), c64(width // lanes), "v") as v:
            lane0 = b.add(x0, b.mul(v.index, c64(lanes)))
            valid = b.trunc(S.intrinsic(b, "smax", [S.intrinsic(b, "smin", [b.sub(count, lane0), c64(lanes)]),
                                                   c64(0)]), S.I32)
            mask = b.icmp_signed("<", ramp, splat(b, valid, it))
            offsets = b.call(masked_load, [b.gep(cols, [lane0], source_etype=S.I32), ir.Constant(S.I32, 4), mask,
                                           ir.Constant(it, [0] * lanes)])
            first = b.extract_element(offsets, ir.Constant(S.I32, 0))
            full = b.icmp_signed("==", valid, ir.Constant(S.I32, lanes))

            def every(lane_flags):
                return b.icmp_unsigned("==", b.bitcast(lane_flags, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), -1))

            def runs(step: int, step_ramp):
                """Whether the offsets are one run of this step from `first`; whether they are
                two (full vector, the second after the first); the lanes of the first run;
                the second run's offset shifted back to lane 0."""
                steps = b.icmp_signed("==", offsets, b.add(splat(b, first, it), step_ramp))
                bits = b.bitcast(steps, ir.IntType(lanes))
                split = b.zext(S.intrinsic(b, "cttz", [b.not_(bits)], (ir.Constant(S.I1, 0),)), S.I32)
                last = S.intrinsic(b, "smin", [split, ir.Constant(S.I32, lanes - 1)])
                second = b.sub(b.extract_element(offsets, last), b.mul(split, ir.Constant(S.I32, step)))
                in_first = b.icmp_signed("<", ramp, splat(b, split, it))
                expected = b.add(b.select(in_first, splat(b, first, it), splat(b, second, it)), step_ramp)
                two = every(b.icmp_signed("==", offsets, expected))
                return every(steps), b.and_(b.and_(two, full), b.icmp_signed(">=", second, first)), in_first, second

            # two runs (the end of one output row, the start of the next): the first lane
            # that breaks the run starts the second, read shifted back by its lane number.
            # Two whole vector loads and a blend: with the second run after the first, every
            # address they touch lies between two elements of the panel, so inside the buffer
            # (masked loads instead cost W7's conv 0.35 ms more on one Zen 5 core)
            consecutive, two, in_first, second = runs(1, ramp)
            # every other element (a stride-2 convolution's output row): two loads that end
            # at the last element and a shuffle of their even positions, per run; a run
            # ends at or before the next one's last element, so these stay inside too
            strided, two_strided, in_first2, second2 = runs(2, ramp2)
            strided = b.and_(strided, full)
            vdst = b.gep(pdst, [b.mul(v.index, c64(lanes))], source_etype=t)

            def each_p(value_at):
                with plain_loop(b, c64(0), kc, "p") as p:
                    row = b.sext(b.load(b.gep(rows, [p.index], source_etype=S.I32), typ=S.I32), S.I64)
                    b.store(value_at(b.gep(src, [row], source_etype=t)),
                            b.gep(vdst, [b.mul(p.index, c64(width))], source_etype=t), align=dtype.itemsize)

            def run(base):
                return b.load(b.gep(base, [b.sext(first, S.I64)], source_etype=t), typ=vt, align=dtype.itemsize)

            def runs(base):
                head = b.load(b.gep(base, [b.sext(first, S.I64)], source_etype=t), typ=vt, align=dtype.itemsize)
                tail = b.load(b.gep(base, [b.sext(second, S.I64)], source_etype=t), typ=vt, align=dtype.itemsize)
                return b.select(in_first, head, tail)

            def evens(base, at=first):
                head = b.load(b.gep(base, [b.sext(at, S.I64)], source_etype=t), typ=vt, align=dtype.itemsize)
                tail = b.load(b.gep(base, [b.sext(b.add(at, ir.Constant(S.I32, lanes - 1)), S.I64)],
                                    source_etype=t), typ=vt, align=dtype.itemsize)
                return b.shuffle_vector(head, tail, evens_mask)

            def strided_runs(base):
                return b.select(in_first2, evens(base), evens(base, second2))

            def gathered(base):
                at = b.gep(base, [offsets], source_etype=t)
                at.type = ir.VectorType(_PTR, lanes)       # llvmlite types a vector GEP as one pointer
                return b.call(gather, [at, ir.Constant(S.I32, dtype.itemsize), mask, zeros])

            def first_that_holds(cases, otherwise):
                """Pack with the first case whose condition holds, else with `otherwise`."""
                if not cases:
                    return each_p(otherwise)
                (holds, value_at), rest = cases[0], cases[1:]
                with b.if_else(holds) as (yes, no):
                    with yes:
                        each_p(value_at)
                    with no:
                        first_that_holds(rest, otherwise)
            first_that_holds([(consecutive, run), (two, runs), (strided, evens), (two_strided, strided_runs)],
                             gathered)
    b.ret_void()
    return fn


def _pack_elements(b: ir.IRBuilder, dtype: DType, width: int, pdst, psrc, kc, sx, sp, valid) -> None:
    """Element by element: rows x < valid from the source, the rest of the panel zeros."""
    t, w = S.register_type(dtype), ir.Constant(S.I64, width)
    with plain_loop(b, ir.Constant(S.I64, 0), kc, "p") as p:
        with plain_loop(b, ir.Constant(S.I64, 0), w, "x") as x:
            inside = b.icmp_signed("<", x.index, valid)
            at = b.select(inside, b.add(b.mul(x.index, sx), b.mul(p.index, sp)), ir.Constant(S.I64, 0))
            value = b.load(b.gep(psrc, [at], source_etype=t), typ=t)
            value = b.select(inside, value, S.constant(0.0, dtype))
            b.store(value, b.gep(pdst, [b.add(b.mul(p.index, w), x.index)], source_etype=t))


def _pack_rows(b: ir.IRBuilder, dtype: DType, width: int, pdst, psrc, kc, sp) -> None:
    """A full panel whose `width` rows are contiguous in the source: one vector per p."""
    t, vt = S.register_type(dtype), ir.VectorType(S.register_type(dtype), width)
    with plain_loop(b, ir.Constant(S.I64, 0), kc, "p") as p:
        value = b.load(b.gep(psrc, [b.mul(p.index, sp)], source_etype=t), typ=vt, align=dtype.itemsize)
        b.store(value, b.gep(pdst, [b.mul(p.index, ir.Constant(S.I64, width))], source_etype=t),
                align=dtype.itemsize)


def _pack_rows_masked(b: ir.IRBuilder, dtype: DType, width: int, pdst, psrc, kc, sp, valid) -> None:
    """The last, partial panel when its rows are contiguous in the source (B row-major
    with n % NR != 0): one masked vector load per p, zeros past `valid`."""
    t = S.register_type(dtype)
    vt = ir.VectorType(t, width)
    lanes = ir.Constant(ir.VectorType(S.I64, width), list(range(width)))
    mask = b.icmp_signed("<", lanes, splat(b, valid, ir.VectorType(S.I64, width)))
    load = S.declare(b.module, f"llvm.masked.load.v{width}{_scalar_name(dtype)}.p0", vt,
                     [_PTR, S.I32, mask.type, vt])
    zeros = ir.Constant(vt, [0.0] * width)
    with plain_loop(b, ir.Constant(S.I64, 0), kc, "p") as p:
        row = b.call(load, [b.gep(psrc, [b.mul(p.index, sp)], source_etype=t),
                            ir.Constant(S.I32, dtype.itemsize), mask, zeros])
        b.store(row, b.gep(pdst, [b.mul(p.index, ir.Constant(S.I64, width))], source_etype=t),
                align=dtype.itemsize)


def _scalar_name(dtype: DType) -> str:
    return "f32" if dtype is DType.float32 else "f64"


def merge_name(dtype: DType, nr: int) -> str:
    return f"tracecomp.matmul.merge.{dtype.label}.{nr}"


def merge_function(module: ir.Module, dtype: DType, nr: int, owner: Optional[DType] = None) -> ir.Function:
    """`merge(tile, c, mr, nr, rs, cs, add)`: the valid mr x nr corner of a stack tile
    (row length NR) into C at c[r * rs + j * cs], overwriting or adding.  `owner`: the
    dtype whose helpers it belongs to (helper_function's key; a nest of half operands whose
    tile width the `dtype` helpers defined elsewhere may not have), named after it."""
    t = S.register_type(dtype)
    name = merge_name(dtype, nr) + (f".{owner.label}" if owner is not None else "")
    fn, b = helper_function(module, owner or dtype, name,
                             [("tile", _PTR), ("c", _PTR), ("mr", S.I64), ("nr", S.I64), ("rs", S.I64),
                              ("cs", S.I64), ("add", S.I1)])
    if b is None:
        return fn
    tile, c, mr, ncols, rs, cs, add = fn.args
    for accumulate in (True, False):
        with b.if_then(add if accumulate else b.not_(add)):
            with plain_loop(b, ir.Constant(S.I64, 0), mr, "r") as r:
                with plain_loop(b, ir.Constant(S.I64, 0), ncols, "j") as j:
                    at = b.gep(c, [b.add(b.mul(r.index, rs), b.mul(j.index, cs))], source_etype=t)
                    src = b.gep(tile, [b.add(b.mul(r.index, ir.Constant(S.I64, nr)), j.index)], source_etype=t)
                    value = b.load(src, typ=t)
                    b.store(b.fadd(b.load(at, typ=t), value) if accumulate else value, at)
    b.ret_void()
    return fn


def transpose(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The columns of a V x V block held as V vectors of V lanes (V a power of two).

    A transpose swaps bit k of the row number with bit k of the lane number, for every k;
    each stage swaps one bit with one shufflevector per row (the off-diagonal h x h
    blocks of each pair of rows h apart trade places), and the stages commute."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        for i in range(n):
            if i & h:
                continue
            lo = [j if not j & h else n + j - h for j in range(n)]
            hi = [j + h if not j & h else n + j for j in range(n)]
            mask = ir.VectorType(S.I32, n)
            rows[i], rows[i + h] = (b.shuffle_vector(rows[i], rows[i + h], ir.Constant(mask, lo)),
                                    b.shuffle_vector(rows[i], rows[i + h], ir.Constant(mask, hi)))
        h //= 2
    return rows


def _transpose_block(width: int, dtype: DType) -> int:
    """The side of the square blocks a full panel is packed in: the largest power of two
    dividing `width`, at most one vector; 1 when that is too small to be worth it."""
    v = min(width & -width, tiles_for(dtype).lanes)
    return v if v >= 4 else 1


def _pack_transposing(b: ir.IRBuilder, dtype: DType, width: int, pdst, psrc, kc, sx) -> None:
    """A full micro-panel whose source runs along p: V x V blocks transposed in registers
    (transpose_function), then the last kc % V steps element by element."""
    t, v = S.register_type(dtype), _transpose_block(width, dtype)
    c64 = functools.partial(ir.Constant, S.I64)

    def at(ptr, offset):
        return b.gep(ptr, [offset], source_etype=t)
    chunks = b.udiv(kc, c64(v)) if v > 1 else c64(0)
    if v > 1:
        block = transpose_function(b.module, dtype, v)
        with plain_loop(b, c64(0), chunks, "pv") as chunk:
            p0 = b.mul(chunk.index, c64(v))
            for g in range(width // v):
                src = at(psrc, b.add(b.mul(c64(g * v), sx), p0))
                b.call(block, [at(pdst, b.add(b.mul(p0, c64(width)), c64(g * v))), src, sx, c64(width)])
    with plain_loop(b, b.mul(chunks, c64(v)), kc, "pr") as p:
        with plain_loop(b, c64(0), c64(width), "x") as x:
            value = b.load(at(psrc, b.add(b.mul(x.index, sx), p.index)), typ=t)
            b.store(value, at(pdst, b.add(b.mul(p.index, c64(width)), x.index)))


def transpose_name(dtype: DType, v: int) -> str:
    return f"tracecomp.matmul.transpose.{dtype.label}.{v}"


def transpose_function(module: ir.Module, dtype: DType, v: int) -> ir.Function:
    """`transpose(dst, src, sx, ld)`: dst[p * ld + x] = src[x * sx + p] for x, p < V, as V
    vector loads, a transpose in registers and V vector stores.  A function of its own
    (not inlined, no loop): inside the packing loop its V * width / V memory accesses
    made LLVM's loop-load elimination compare every pair, a quadratic cost in LLVM
    time for NR = 32)."""
    t, align = S.register_type(dtype), dtype.itemsize
    vt = ir.VectorType(t, v)
    fn, b = helper_function(module, dtype, transpose_name(dtype, v),
                             [("dst", _PTR), ("src", _PTR), ("sx", S.I64), ("ld", S.I64)])
    if b is None:
        return fn
    dst, src, sx, ld = fn.args
    rows = [b.load(b.gep(src, [b.mul(ir.Constant(S.I64, x), sx)], source_etype=t), typ=vt, align=align)
            for x in range(v)]
    for p, column in enumerate(transpose(b, rows)):
        b.store(column, b.gep(dst, [b.mul(ir.Constant(S.I64, p), ld)], source_etype=t), align=align)
    b.ret_void()
    return fn
