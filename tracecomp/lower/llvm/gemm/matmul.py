"""CPU code for the loop IR's Matmul statement: a blocked, packed, parallel kernel.

`emit_matmul(em, s, env)` emits statement `s` into the function `em` is building.
- Matmuls without a workspace (the scheduler gives none to integer, vector and thin
  products: schedule.tiles.uses_packed), empty ones and ones with dynamic extents run the
  statement's loop expansion (loops/matmul.py) through the ordinary emitter: ikj order,
  whose inner loop LLVM vectorizes, or ijk (a vectorized dot product per element) when
  n == 1.
- Float products with a workspace run the GotoBLAS/BLIS loop nest (block sizes and their
  reasons in schedule/tiles.py), one work item at a time:
      for jc in n-range step NC:           B panel  KC x NC  -> workspace (L3)
        for pc in 0..k step KC:            pack B[pc:pc+kc, jc:jc+nc]
          for ic in m-range step MC:       A block  MC x KC  -> workspace (L2)
            for jr step NR, ir step MR:    micro-kernel on the L1-resident micro-panels
  A Matmul with `b_windows` (conv2d's window matrix: reads_windows) packs B straight
  from the input through two i32 offset tables, one per row and one per column of B
  (constants of the module; with run-time sizes, buffers the kernel fills per call), and
  the kernel skips the statements that fill b (cpu_body): implicit GEMM.  W7's conv: 5.0 -> 3.6 ms, with no 42 MB im2col pass.  A half input's
  windows are packed in the half path's layout, converted or as K-pairs (halfwindows.py).
  The nest is one function per dtype and module (llvm/gemm/nest.py, sizes and strides
  as arguments), shared by all products: a copy per product would cost its own LLVM time.
  The micro-kernel (llvm/gemm/microkernel.py) writes full tiles straight into C; partial tiles
  (and C with a non-unit column stride) go through a stack tile that `merge` copies out.
  After the last K-block the nest calls the product's epilogue over the tile just stored,
  while it is in L1: an outlined function per kind of tile (whole, edge; only the kinds
  the static sizes allow) that loops over the tile's elements, reads the accumulated value
  as `acc`, binds the index names, and evaluates the loop-IR epilogue with the ordinary
  emitter (so every Unary, Binary and math function works there, vectorized along j).
  The nest reaches it through a pointer, with a context holding the kernel's buffers,
  sizes and visible names.

Parallelism: a work item is one part of one batch matrix; each matrix splits into `parts`
ranges of register tiles along one dim (schedule.tiles.Blocks.split_m), so that there are
about ITEMS_PER_THREAD items per thread (T threads: min(omp_get_max_threads(), what the
workspace holds)).  Threads claim items dynamically (llvm.parallel.claimed_chunks): one
that the OS deschedules leaves its items to the others instead of stalling the product,
and a team that kept its caller waiting anyway turns on llvm/parallel.py's serial back-off
(which products below BACKOFF_MAX_FLOPS follow).
Each thread packs into its own slice of the workspace; no barriers are needed because
items write disjoint parts of C.  The items run in an outlined `<kernel>.mm<k>.part`
function (buffers, sizes and visible names as arguments, like llvm/parallel.py's outlined
loops), called directly for small products or from `GOMP_parallel` through `.omp`, which
claims items and passes the thread's workspace slice.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from ....core.errors import BackendError
from .. import loop_ids
from .. import scalar as S
from ..emitter import FunctionEmitter, counted_loop
from ..loop_hints import plain_loop
from ..math.functions import math_calls
from .microkernel import pack_function
from .nest import EPILOGUE_PTR, EPILOGUE_TYPE, nest_function
from ..parallel import (claimed_chunks, entry_alloca, mark_done, outlined_function, recently_late, start_team,
                        struct_field)
from ...loops.ir import Const, Kernel, Let, Load, Matmul, PackB, Store, Var, View, INDEX
from ...loops.walk import buffers_written
from ...loops.matmul import flat_index, flat_name, index_names
from ...schedule.tiles import PACKED_DTYPES, Blocks, blocks, flops, max_threads, tiles_for

PARALLEL_MIN_FLOPS = 1 << 20        # smaller products run on the calling thread
ITEMS_PER_THREAD = 2                # work items per thread, claimed dynamically
BACKOFF_MAX_FLOPS = 1 << 28         # larger products (~1 ms and up) ignore llvm/parallel.py's back-off
TABLE_LIMIT = 1 << 31               # a window's row offset plus its column offset: below it, i32 tables
_PTR = ir.PointerType()


@dataclass(frozen=True)
class Plan:
    blocks: Blocks
    capacity: int          # threads the workspace holds panels for


def _packable(kernel: Kernel, s: Matmul, dtype) -> bool:
    """Whether the packed kernel runs `s` (given a workspace large enough: _plan)."""
    return (s.workspace is not None and dtype in PACKED_DTYPES
            and 0 not in (s.m, s.n, s.k, *s.batch) and isinstance(kernel.buffer(s.workspace).shape[0], int))


def reads_windows(kernel: Kernel, s: Matmul) -> bool:
    """Whether the packed kernel reads `s.b_windows` (implicit GEMM) rather than `b`: then
    the statements that fill b's buffer need not run (cpu_body).  When it runs `s`: static
    windows when their offsets fit the i32 tables, run-time ones (offset tables filled per
    call) whenever, as the fit is checked per call (emit_matmul)."""
    w = s.b_windows
    if w is None or not _packable(kernel, s, kernel.buffer(s.out.buffer).dtype):
        return False
    if not w.is_static():
        return w.row_table is not None
    if not all(isinstance(d, int) for d in (s.m, s.n, s.k)):
        return False
    rows, cols = w.row_offsets(), w.column_offsets()
    return max(rows) + max(cols) < TABLE_LIMIT and min(rows + cols) >= 0


def cpu_body(kernel: Kernel) -> list:
    """The kernel's statements as the CPU runs them: without the fill of a window matrix
    that its Matmul reads in place (loops.ir: Matmul.b_windows)."""
    body = kernel.body
    if not body or not isinstance(body[-1], Matmul) or not reads_windows(kernel, body[-1]):
        return body
    fills = _b_fills(kernel, body[-1])
    return [st for st in body[:-1] if not any(st is f for f in fills)] + [body[-1]]


def _b_fills(kernel: Kernel, s: Matmul) -> list:
    """The statements before `s` that fill its b (and nothing else)."""
    return [st for st in kernel.body[:-1] if buffers_written(st) == {s.b.buffer}]


def operand_dtypes(kernel: Kernel, s: Matmul) -> tuple:
    """The dtypes of the buffers the packed kernel reads a and b from (b: the windows' input
    when it reads them in place), which pick its path and tiles (schedule/tiles.py)."""
    b = s.b_windows.buffer if reads_windows(kernel, s) else s.b.buffer
    return kernel.buffer(s.a.buffer).dtype, kernel.buffer(b).dtype


def emit_matmul(em: FunctionEmitter, s: Matmul, env: dict[str, ir.Value]) -> None:
    dtype = em.kernel.buffer(s.out.buffer).dtype
    plan = _plan(em, s, dtype)
    if plan is None:
        em.matmul_loops(s, env)
    elif reads_windows(em.kernel, s) and not s.b_windows.is_static():
        _emit_run_time_windows(em, s, env, plan)
    else:
        _emit_packed(em, s, env, plan)


def _emit_run_time_windows(em: FunctionEmitter, s: Matmul, env: dict, plan: Plan) -> None:
    """Windows of run-time sizes: read in place when this call's offsets fit the i32
    tables (a row's plus a column's below TABLE_LIMIT), else b filled (the statements
    cpu_body left out) and multiplied as a plain operand."""
    b, w = em.builder, s.b_windows
    reach = None
    for shape, strides in ((w.k_shape, w.k_strides), (w.n_shape, w.n_strides)):
        for n, st in zip(shape, strides):
            term = b.mul(b.sub(em.extent(n), ir.Constant(S.I64, 1)), em.extent(st))
            reach = term if reach is None else b.add(reach, term)
    fits = b.icmp_signed("<", reach, ir.Constant(S.I64, TABLE_LIMIT))
    with b.if_else(fits) as (in_place, filled):
        with in_place:
            em.forget_values()          # (values built in one arm do not dominate the other)
            _emit_packed(em, s, env, plan)
        with filled:
            em.forget_values()
            em.emit_body(_b_fills(em.kernel, s), dict(env))
            plain = dataclasses.replace(s, b_windows=None)
            _emit_packed(em, plain, env, _plan(em, plain, em.kernel.buffer(s.out.buffer).dtype))
    em.forget_values()


def emit_pack_b(em: FunctionEmitter, s: PackB, env: dict[str, ir.Value]) -> None:
    """b packed whole into s.buffer: the panels of NR columns, each all k rows deep (the
    layout a nest given b_packed reads: llvm/gemm/nest.py)."""
    dtype = em.kernel.buffer(s.buffer).dtype
    b, t = em.builder, S.register_type(dtype)
    src = b.gep(em.buffers[s.b.buffer][1], [em.expr(s.b.offset, env)], source_etype=t)
    rs, cs = (em.expr(st, env) for st in s.b.strides)
    pack = pack_function(em.module, dtype, tiles_for(dtype).nr)
    b.call(pack, [em.buffers[s.buffer][1], src, em.extent(s.n), em.extent(s.k), cs, rs])


def _plan(em: FunctionEmitter, s: Matmul, dtype) -> Plan | None:
    """The packed plan; m, n, k and the batch dims may be run-time sizes (dynamic dims)."""
    if not _packable(em.kernel, s, dtype):
        return None
    ws = em.kernel.buffer(s.workspace)
    bl = blocks(dtype, *(d if isinstance(d, int) else None for d in (s.m, s.n, s.k)), operand_dtypes(em.kernel, s))
    capacity = ws.shape[0] // bl.thread_elements
    if capacity < 1:
        raise BackendError(f"kernel '{em.kernel.name}': Matmul workspace '{s.workspace}' holds "
                           f"{ws.shape[0]} elements, a thread needs {bl.thread_elements} "
                           "(size it with schedule.tiles.workspace_elements)")
    return Plan(bl, capacity)


def _batch_count(em: FunctionEmitter, s: Matmul) -> ir.Value:
    """The number of batch matrices, an i64 (folded where the batch dims are static)."""
    if all(isinstance(d, int) for d in s.batch):
        return ir.Constant(S.I64, math.prod(s.batch))
    total = ir.Constant(S.I64, 1)
    for d in s.batch:
        total = em.builder.mul(total, em.extent(d))
    return total


def _emit_packed(em: FunctionEmitter, s: Matmul, env: dict[str, ir.Value], plan: Plan) -> None:
    """Call the outlined work-item function: directly, or on every thread via libgomp."""
    b = em.builder
    captured = [(name, v) for name, v in env.items() if name not in em.sizes]
    prefix = f"{em.fn.name}.mm{em.parallel_loops}"
    em.parallel_loops += 1
    part = _part_function(em, s, captured, plan, f"{prefix}.part")
    leading = list(em.fn.args[:len(em.kernel.buffers) + len(em.kernel.sizes)])
    args = leading + [v for _, v in captured] + [em.buffers[s.workspace][1]]
    batch = _batch_count(em, s)

    def serial():
        b.call(part, args + [ir.Constant(S.I64, 0), batch, ir.Constant(S.I64, 1)])
    if em.in_parallel:
        _on_this_thread(em, s, env, plan, part, args)
        return
    work = _flops(em, s, batch)
    if _below(b, work, PARALLEL_MIN_FLOPS) is True or plan.capacity < 2:
        serial()
        return
    max_threads = S.declare(em.module, "omp_get_max_threads", S.I32, [], attrs=("nounwind",))
    threads = S.intrinsic(b, "smin", [b.sext(b.call(max_threads, []), S.I64),
                                      ir.Constant(S.I64, plan.capacity)])
    one_thread = b.icmp_signed("<", threads, ir.Constant(S.I64, 2))
    small = _below(b, work, PARALLEL_MIN_FLOPS)       # a run-time size: decided at run time
    if small is not False:
        one_thread = b.or_(one_thread, small)
    late_matters = _below(b, work, BACKOFF_MAX_FLOPS)
    if late_matters is not False:
        late = recently_late(b)
        one_thread = b.or_(one_thread, late if late_matters is True else b.and_(late_matters, late))
    with b.if_else(one_thread) as (one, many):
        with one:
            serial()
        with many:
            _launch(em, s, plan, part, args, threads, prefix)


def _on_this_thread(em: FunctionEmitter, s: Matmul, env: dict, plan: Plan, part: ir.Function, args: list) -> None:
    """A Matmul inside a parallel Loop (the fused attention's products, per batch item) runs
    on the thread that reaches it, packing into that thread's slice of the workspace.  The
    slices are the workspace split evenly over tiles.max_threads() threads, the same for
    every product of the kernel: threads run different products at once, and slices sized
    per product would overlap.  A thread numbered past them (OMP_NUM_THREADS above the core
    count) runs the plain loops instead."""
    b = em.builder
    threads = max_threads()
    slice_elements = em.kernel.buffer(s.workspace).shape[0] // threads
    if slice_elements < plan.blocks.thread_elements:
        raise BackendError(f"kernel '{em.kernel.name}': Matmul workspace '{s.workspace}' split over {threads} "
                           f"threads gives {slice_elements} elements each; this product needs "
                           f"{plan.blocks.thread_elements}")
    thread_num = S.declare(em.module, "omp_get_thread_num", S.I32, [], attrs=("nounwind",))
    tid = b.sext(b.call(thread_num, []), S.I64)
    element = S.register_type(em.kernel.buffer(s.workspace).dtype)
    with b.if_else(b.icmp_signed("<", tid, ir.Constant(S.I64, threads))) as (fits, beyond):
        with fits:
            slice_ = b.gep(args[-1], [b.mul(tid, ir.Constant(S.I64, slice_elements))], source_etype=element)
            b.call(part, args[:-1] + [slice_, ir.Constant(S.I64, 0), _batch_count(em, s), ir.Constant(S.I64, 1)])
        with beyond:
            em.matmul_loops(s, env)


def _flops(em: FunctionEmitter, s: Matmul, batch: ir.Value):
    """The product's FLOPs: an int, or an i64 value when a size is known at run time only."""
    if all(isinstance(d, int) for d in (s.m, s.n, s.k)) and isinstance(batch, ir.Constant):
        return flops(s.m, s.n, s.k, batch.constant)
    b = em.builder
    total = b.mul(ir.Constant(S.I64, 2), batch)
    for d in (s.m, s.n, s.k):
        total = b.mul(total, em.extent(d))
    return total


def _below(b: ir.IRBuilder, work, limit: int):
    """work < limit: a bool for static work, an i1 value for run-time work."""
    if isinstance(work, int):
        return work < limit
    return b.icmp_signed("<", work, ir.Constant(S.I64, limit))


def _split_tiles(em: FunctionEmitter, s: Matmul, bl: Blocks) -> ir.Value:
    """Register tiles along the split dim (schedule.tiles.Blocks.split_tiles, at run time
    when that dim is a run-time size)."""
    size, step = (s.m, bl.tiles.mr) if bl.split_m else (s.n, bl.tiles.nr)
    if isinstance(size, int):
        return ir.Constant(S.I64, -(-size // step))
    b = em.builder
    return b.sdiv(b.add(em.extent(size), ir.Constant(S.I64, step - 1)), ir.Constant(S.I64, step))


def _launch(em: FunctionEmitter, s: Matmul, plan: Plan, part: ir.Function, args: list,
            threads: ir.Value, prefix: str) -> None:
    """GOMP_parallel over `threads` threads, on batch * parts work items: each matrix splits
    into parts = ceil(threads * ITEMS_PER_THREAD / batch), at most one per register tile."""
    b = em.builder
    batch, split = _batch_count(em, s), _split_tiles(em, s, plan.blocks)
    wanted = b.mul(threads, ir.Constant(S.I64, ITEMS_PER_THREAD))
    parts = b.sdiv(b.sub(b.add(wanted, batch), ir.Constant(S.I64, 1)), batch)
    parts = S.intrinsic(b, "smin", [parts, split])
    struct = ir.LiteralStructType([a.type for a in args] + [S.I64] * 4)
    data = entry_alloca(em, struct)
    zero = ir.Constant(S.I64, 0)
    for k, value in enumerate(args + [b.mul(batch, parts), parts, zero, zero]):    # counter = 0, done
        b.store(value, struct_field(b, data, struct, k))
    element = S.register_type(em.kernel.buffer(s.workspace).dtype)
    omp = _omp_function(em.module, part, struct, plan.blocks.thread_elements, element, f"{prefix}.omp")
    start_team(b, omp, data, struct_field(b, data, struct, len(args) + 3), b.trunc(threads, S.I32))


def _omp_function(module: ir.Module, part: ir.Function, struct: ir.LiteralStructType,
                  thread_elements: int, element: ir.Type, name: str) -> ir.Function:
    """`void name(ptr data)`: the work items this thread claims, one at a time, packing
    into its own `thread_elements` slice of the workspace."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR]), name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    *args, ws, items, parts = [b.load(struct_field(b, fn.args[0], struct, k), typ=t)
                               for k, t in enumerate(struct.elements[:-2])]
    counter, done = (struct_field(b, fn.args[0], struct, len(struct.elements) - k) for k in (2, 1))
    with claimed_chunks(b, module, counter, items, ir.Constant(S.I64, 1)) as (tid, lo, hi):
        slice_ = b.gep(ws, [b.mul(tid, ir.Constant(S.I64, thread_elements))], source_etype=element)
        b.call(part, args + [slice_, lo, hi, parts])
    mark_done(b, tid, done)
    b.ret_void()
    return fn


def _part_function(em: FunctionEmitter, s: Matmul, captured, plan: Plan, name: str) -> ir.Function:
    """`name(buffers, sizes, captured, ws, lo, hi, parts)`: work items [lo, hi)."""
    fn, inner, env = outlined_function(em, captured, name, [("ws", _PTR), ("lo", S.I64), ("hi", S.I64),
                                                            ("parts", S.I64)])
    ws, lo, hi, parts = fn.args[-4:]
    b = inner.builder
    with counted_loop(b, lo, hi, "mm.item") as item:
        index = b.sdiv(item.index, parts)
        env_b = dict(env)
        names = index_names(s)
        for name_d, value in zip(names[:-2], _delinearize(b, index, [inner.extent(d) for d in s.batch])):
            env_b[name_d] = value
        rng = _item_range(inner, b.srem(item.index, parts), parts, s, plan.blocks)
        _Item(inner, s, plan.blocks, env_b, ws).emit(*rng)
    inner.finish()
    return fn


def _delinearize(b: ir.IRBuilder, flat: ir.Value, extents: list[ir.Value]) -> list[ir.Value]:
    out = []
    for n in reversed(extents):
        out.append(b.srem(flat, n))
        flat = b.sdiv(flat, n)
    return out[::-1]


def _item_range(em: FunctionEmitter, part: ir.Value, parts: ir.Value, s: Matmul, bl: Blocks):
    """(m_lo, m_hi, n_lo, n_hi) of one part: a balanced range of register tiles."""
    b = em.builder
    tiles = _split_tiles(em, s, bl)
    t0 = b.sdiv(b.mul(part, tiles), parts)
    t1 = b.sdiv(b.mul(b.add(part, ir.Constant(S.I64, 1)), tiles), parts)
    step, size = (bl.tiles.mr, s.m) if bl.split_m else (bl.tiles.nr, s.n)
    lo = b.mul(t0, ir.Constant(S.I64, step))
    hi = S.intrinsic(b, "smin", [b.mul(t1, ir.Constant(S.I64, step)), em.extent(size)])
    zero = ir.Constant(S.I64, 0)
    if bl.split_m:
        return lo, hi, zero, em.extent(s.n)
    return zero, em.extent(s.m), lo, hi


def _offset_table(module: ir.Module, offsets: list[int]) -> ir.GlobalVariable:
    """A constant i32 array of the module (one per distinct table)."""
    digest = hashlib.sha1(np.asarray(offsets, dtype=np.int32).tobytes()).hexdigest()[:16]
    name = f"tracecomp.matmul.offsets.{len(offsets)}.{digest}"
    found = module.globals.get(name)
    if found is not None:
        return found
    t = ir.ArrayType(S.I32, len(offsets))
    g = ir.GlobalVariable(module, t, name)
    g.global_constant, g.linkage, g.align = True, "internal", 64
    g.initializer = ir.Constant(t, offsets)
    return g


class _Item:
    """One work item (rows [m_lo, m_hi), columns [n_lo, n_hi) of one batch matrix): a call
    of the module's loop nest (llvm/gemm/nest.py) with this product's operands, block
    sizes and epilogue functions."""

    def __init__(self, em: FunctionEmitter, s: Matmul, bl: Blocks, env: dict, ws: ir.Value):
        self.em, self.s, self.bl, self.env, self.b, self.ws = em, s, bl, env, em.builder, ws
        self.dtype = em.kernel.buffer(s.out.buffer).dtype
        self.t = S.register_type(self.dtype)
        zeros = (Const(0, INDEX), Const(0, INDEX))
        names = index_names(s)
        batch = tuple(Var(n, INDEX) for n in names[:-2])
        self.ptr, self.rs, self.cs = {}, {}, {}
        views = dict(zip(("out", "a", "b"), s.views()))
        windows = s.b_windows if reads_windows(em.kernel, s) else None
        if windows is not None:         # b's batch offset in the input; rows and columns from tables
            strides = tuple(Const(st, INDEX) if isinstance(st, int) else st for st in windows.batch_strides) + zeros
            views["b"] = View(windows.buffer, windows.offset, strides)
        self.operand_dtypes = operand_dtypes(em.kernel, s)
        for role, view in views.items():
            base = em.buffers[view.buffer][1]
            element = S.memory_type(em.kernel.buffer(view.buffer).dtype)      # (a half operand: i16)
            self.ptr[role] = self.b.gep(base, [em.expr(flat_index(view, batch + zeros), env)], source_etype=element)
            self.rs[role] = em.expr(view.strides[-2], env)
            self.cs[role] = em.expr(view.strides[-1], env)
        null = ir.Constant(_PTR, None)
        if windows is None:
            self.tables = (null, null)
        elif windows.is_static():
            self.tables = (_offset_table(em.module, windows.row_offsets()),
                           _offset_table(em.module, windows.column_offsets()))
        else:                            # filled by the kernel's statements, this call's sizes
            self.tables = (em.buffers[windows.row_table][1], em.buffers[windows.column_table][1])
        self.b_packed = null if s.b_packed is None or windows is not None else em.buffers[s.b_packed][1]
        self.visible = [(n, v) for n, v in env.items() if n not in em.sizes]   # passed to the epilogues

    def c64(self, v: int) -> ir.Constant:
        return ir.Constant(S.I64, v)

    def emit(self, m_lo, m_hi, n_lo, n_hi) -> None:
        bl, s = self.bl, self.s
        nest = nest_function(self.em.module, self.dtype, *self.operand_dtypes)
        whole, edge, context = self.epilogues()
        operands = [value for role in ("a", "b", "out") for value in (self.ptr[role], self.rs[role], self.cs[role])]
        self.b.call(nest, operands + [m_lo, m_hi, n_lo, n_hi, self.em.extent(s.k), self.c64(bl.kc), self.c64(bl.mc),
                                      self.c64(bl.nc), self.ws, self.c64(bl.a_elements),
                                      ir.Constant(S.I1, int(s.accumulate)), whole, edge, context, *self.tables,
                                      self.b_packed])

    def epilogues(self) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(whole-tile epilogue, edge-tile epilogue, their context): null pointers without an
        epilogue or for a kind of tile that cannot occur (tile_kinds); the context holds the
        kernel's buffers and sizes and the visible names, stored for this item."""
        null = ir.Constant(EPILOGUE_PTR, None)
        if self.s.epilogue is None:
            return null, null, ir.Constant(_PTR, None)
        values = list(self.em.fn.args[:len(self.em.kernel.buffers) + len(self.em.kernel.sizes)])
        values += [v for _, v in self.visible]
        struct = ir.LiteralStructType([v.type for v in values])
        context = entry_alloca(self.em, struct)
        for k, value in enumerate(values):
            self.b.store(value, struct_field(self.b, context, struct, k))
        whole, edge = self.tile_kinds()
        return (self.epilogue_entry(True, struct) if whole else null,
                self.epilogue_entry(False, struct) if edge else null, context)

    def epilogue_entry(self, whole: bool, struct: ir.LiteralStructType) -> ir.Function:
        """`<part>.epilogue.<whole|edge>.entry(context, i0, j0, mr, nr)`, the nest's view of
        epilogue_function: it loads the arguments from the context."""
        inner = self.epilogue_function(whole)
        inner.attributes.discard("noinline")
        inner.attributes.add("alwaysinline")
        fn = ir.Function(self.em.module, EPILOGUE_TYPE, f"{inner.name}.entry")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        context, i0, j0, mr, nr = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        values = [b.load(struct_field(b, context, struct, k), typ=t) for k, t in enumerate(struct.elements)]
        b.call(inner, values + [i0, j0] + ([] if whole else [mr, nr]))
        b.ret_void()
        return fn

    def tile_kinds(self) -> tuple[bool, bool]:
        """(whole tiles can occur, edge tiles can occur), known from the static sizes:
        work items and blocks are whole register tiles except at the end of m and n, and
        a tile goes straight into C only when C's columns are contiguous.  Emitting only
        the paths that can run saves LLVM a copy of the epilogue per product."""
        tiles, s = self.bl.tiles, self.s
        cs = self.cs["out"]
        unit_columns = isinstance(cs, ir.Constant) and cs.constant == 1
        strided_columns = isinstance(cs, ir.Constant) and cs.constant != 1
        if not (isinstance(s.m, int) and isinstance(s.n, int)):       # run-time sizes: either
            return not strided_columns, True
        whole = s.m >= tiles.mr and s.n >= tiles.nr and not strided_columns
        edge = s.m % tiles.mr != 0 or s.n % tiles.nr != 0 or not unit_columns
        return whole, edge

    def epilogue_function(self, whole: bool) -> ir.Function:
        """`<part>.epilogue.<whole|edge>(buffers, sizes, visible names, i0, j0[, mr, nr])`:
        out[i, j] = epilogue(acc = out[i, j]) over the tile just stored, while it is in L1.
        Outlined (a call per tile) because inlined in the tile loops, its dozens of
        addresses made LLVM's loop strength reduction search at length for every product.
        Whole tiles put the row loop inside (constant bounds): LLVM vectorizes the column
        loop, contiguous in C, and unrolls the row loop (asked to) unless the epilogue applies
        a math function: unrolled, each row's loop hoisted and spilled the polynomials' few
        dozen constants of its own, and W8's GELU-derivative product took 12.4 ms instead of
        6.2 (cheap epilogues gain from the unrolling: W4 1.91 vs 2.24 ms).  With the rows outside, it unrolled
        the 32 columns and vectorized the rows with gathers and scatters (4x slower).
        Edge tiles run their loops as written (rows outside).  The nest reaches it through
        epilogue_entry, into which it is inlined."""
        extra = [("i0", S.I64), ("j0", S.I64)] + ([] if whole else [("mr", S.I64), ("nr", S.I64)])
        name = f"{self.em.fn.name}.epilogue.{'whole' if whole else 'edge'}"
        fn, inner, env = outlined_function(self.em, self.visible, name, extra)
        i0, j0 = fn.args[-len(extra)], fn.args[-len(extra) + 1]
        mr, nr = (None, None) if whole else fn.args[-2:]
        self.epilogue_loops(inner, env, i0, j0, mr, nr, whole)
        inner.finish()
        return fn

    def epilogue_loops(self, inner: FunctionEmitter, env: dict, i0, j0, mr, nr, whole: bool) -> None:
        """The loops over the tile's elements at (i0, j0), emitted by `inner`."""
        s, tiles, b = self.s, self.bl.tiles, inner.builder
        if whole:
            mr, nr = self.c64(tiles.mr), self.c64(tiles.nr)
        names = index_names(s)
        at = flat_index(s.out, tuple(Var(n, INDEX) for n in names))
        out = flat_name(s.out.buffer)
        body = [Let(s.acc, Load(out, (at,), self.dtype)), Store(out, (at,), s.epilogue)]
        loop = counted_loop if whole else plain_loop
        with loop(b, self.c64(0), mr, "mm.r") as o:         # rows outside: the columns are contiguous,
            with loop(b, self.c64(0), nr, "mm.c") as i:     # so a whole tile's inner loop vectorizes
                r, c = o.index, i.index
                inner.emit_body(body, {**env, names[-2]: b.add(i0, r), names[-1]: b.add(j0, c)})
        if whole and not math_calls(s.epilogue):
            loop_ids.attach(o.index, b.module, loop_ids.unroll_full(b.module))
