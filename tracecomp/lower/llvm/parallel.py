"""Parallel loops: the outermost `Loop(parallel=True)` of a kernel runs on all cores.

For such a loop `for i in range(n): body` the kernel gets two internal functions:
- `<kernel>.par<k>.range(buffers..., sizes..., captured..., lo, hi)` runs `body` for i in
  [lo, hi).  It takes the buffers as `noalias` arguments again, so the vectorizer sees the
  same facts as in the kernel itself, and is `noinline`;
- `<kernel>.par<k>.chunk(ptr data, lo, hi)` calls `.range` with the arguments the kernel
  stored in the struct at `data`;
and calls the module's `tracecomp.parallel.run(chunk, data, n, work)`, which runs the
chunk function on [0, n) itself or starts a team: every thread runs the module's
`tracecomp.parallel.team`, which calls the chunk function on the chunks it claims.  The
runner and the team are defined once per module (the choice and the team's timing inlined
into every loop were a third of the LLVM time of W8's step); a loop whose work is known to
be small calls `.range` directly.
Work is split dynamically (`claimed_chunks`): the n iterations form CHUNKS_PER_THREAD
chunks per thread, and every thread claims chunk `counter++` (an atomic add on a counter
in the struct, zeroed by the caller) until none is left.  With a static split, a thread
that the OS deschedules holds back the whole region by its share of the work (W4's median
grew several-fold on a shared 2-core machine); now the threads that run take
its chunks, and the region waits only for the chunk in flight, or for a thread that has
not started yet to reach libgomp's closing barrier.
That last wait is what remains on a loaded machine: a worker waiting for a core makes the
caller wait too, at every region (W4 on 2 cores at load 8 ran slower than on one
thread).  So each region times itself (`start_team`): when the calling thread
waited at the closing barrier for more than half as long as it worked, plus LATE_MIN_CYCLES,
the module's parallel regions run serially for a while (a global of the module, read
before each region): BACKOFF_CYCLES, doubled after every late try up to MAX_BACKOFF_CYCLES
and reset by a team that was on time.  Under a steady load that is one stall (tens of ms
at load 15 on 2 cores) per second of serial work; on a quiet machine no team is late.
Only small regions back off (below BACKOFF_MAX_WORK, or llvm.gemm.matmul.BACKOFF_MAX_FLOPS):
in a long region a late worker just claims fewer chunks, and running it serially would
cost more than the wait.

Why libgomp (GCC's OpenMP runtime) rather than a thread pool of our own:
- `GOMP_parallel(fn, data, nthreads, flags)` is a stable C ABI that GCC-compiled code has
  used for a decade; it keeps its worker threads alive between calls (a parallel region
  costs a few microseconds), honours OMP_NUM_THREADS, and runs on the calling thread too;
- no C compiler is needed at JIT time: the JIT resolves the symbols from libgomp.so.1,
  loaded into the process (runtime/jit.py), and an exported .so links `-lgomp`;
- a pool written in LLVM IR or Python would need its own thread creation, work
  distribution and barrier, all of which libgomp already gets right (and a Python pool
  would need the GIL, which compiled code runs without).
The costs: exported libraries depend on libgomp.so.1 as well as libc and libm; and
libgomp is not fork-safe (a forked child that starts a team on a thread that had one
hangs), so the JIT sets omp_set_num_threads(1) in forked children (runtime/jit.py) and
kernels then take the serial path without touching libgomp's thread pool.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import llvmlite.ir as ir

from . import scalar as S
from .emitter import FunctionEmitter, declare_kernel_function
from ..loops.ir import Binary, Loop, Matmul, Reduce
from ..loops.walk import var_names
from ..schedule.tiles import parallel_min_work

CHUNKS_PER_THREAD = 4              # loop chunks per thread: enough to rebalance, few enough to stream
LATE_MIN_CYCLES = 100_000          # ~40 us of time-stamp counter: a wait below this is never "late"
BACKOFF_CYCLES = 100_000_000       # ~40 ms of serial regions after a late team...
MAX_BACKOFF_CYCLES = 1 << 32       # ...doubling after each late try up to ~1.6 s
BACKOFF_MAX_WORK = 1 << 22         # larger loops (~1 ms and up) never back off
_SERIAL_UNTIL = "tracecomp.parallel.serial_until"
_BACKOFF = "tracecomp.parallel.backoff"
_RUN, _TEAM_FN = "tracecomp.parallel.run", "tracecomp.parallel.team"
_PTR = ir.PointerType()
_CHUNK_TYPE = ir.FunctionType(ir.VoidType(), [_PTR, S.I64, S.I64])
_CHUNK_PTR = ir.PointerType(_CHUNK_TYPE)      # prints as `ptr`; llvmlite needs the type to call
_TEAM = ir.LiteralStructType([_CHUNK_PTR, _PTR, S.I64, S.I64, S.I64])     # chunk, data, n, counter, done


def emit_parallel_loop(em: FunctionEmitter, loop: Loop, env: dict[str, ir.Value]) -> None:
    """Emit `loop` into `em`'s function: its body outlined (`.range`), and a call of the
    module's runner (`run_function`) with the loop's `.chunk` function, which decides
    between the serial path and a GOMP_parallel team.  A loop known to be small calls
    `.range` directly."""
    b = em.builder
    captured = [(name, v) for name, v in env.items() if name not in em.sizes]
    prefix = f"{em.fn.name}.par{em.parallel_loops}"
    em.parallel_loops += 1
    range_fn = _range_function(em, loop, captured, f"{prefix}.range")
    leading = list(em.fn.args[:len(em.kernel.buffers) + len(em.kernel.sizes)])
    args = leading + [v for _, v in captured]
    n = em.extent(loop.extent)
    work = _mul(b, n, _inner_work(em, loop.body))
    if isinstance(work, ir.Constant) and work.constant < parallel_min_work() \
            or isinstance(n, ir.Constant) and n.constant < 2:
        b.call(range_fn, args + [ir.Constant(S.I64, 0), n])      # known to be small: serial
        return
    struct = ir.LiteralStructType([a.type for a in args])
    data = entry_alloca(em, struct)
    for k, value in enumerate(args):
        b.store(value, struct_field(b, data, struct, k))
    chunk = _chunk_function(em.module, range_fn, struct, f"{prefix}.chunk")
    b.call(run_function(em.module), [chunk, data, n, work])


def _chunk_function(module: ir.Module, range_fn: ir.Function, struct: ir.LiteralStructType,
                    name: str) -> ir.Function:
    """`void name(ptr data, i64 lo, i64 hi)`: `.range` on [lo, hi) with the arguments in
    the struct at `data` (what the runner calls, serially or on every thread)."""
    fn = ir.Function(module, _CHUNK_TYPE, name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    data, lo, hi = fn.args
    args = [b.load(struct_field(b, data, struct, k), typ=t) for k, t in enumerate(struct.elements)]
    b.call(range_fn, args + [lo, hi])
    b.ret_void()
    return fn


def run_function(module: ir.Module) -> ir.Function:
    """`void tracecomp.parallel.run(ptr chunk, ptr data, i64 n, i64 work)`, defined once
    per module: chunk(data, 0, n) on this thread when the loop is small (`work` innermost
    iterations below schedule.tiles.parallel_min_work(), or n < 2), OpenMP allows one thread, or the
    module backs off (below); else a team (`team_function`) over [0, n).  One copy for all
    the module's loops: inlined into each, this choice and the team's timing were a third
    of a module's LLVM time (W8's step)."""
    fn = module.globals.get(_RUN)
    if fn is not None:
        return fn
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_CHUNK_PTR, _PTR, S.I64, S.I64]), _RUN)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    chunk, data, n, work = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    small = b.or_(b.icmp_signed("<", work, ir.Constant(S.I64, parallel_min_work())),
                  b.icmp_signed("<", n, ir.Constant(S.I64, 2)))
    max_threads = S.declare(module, "omp_get_max_threads", S.I32, [], attrs=("nounwind",))
    one_thread = b.icmp_signed("<", b.call(max_threads, []), ir.Constant(S.I32, 2))
    backs_off = b.and_(recently_late(b), b.icmp_signed("<", work, ir.Constant(S.I64, BACKOFF_MAX_WORK)))
    with b.if_else(b.or_(b.or_(small, one_thread), backs_off)) as (serial, parallel):
        with serial:
            b.call(chunk, [data, ir.Constant(S.I64, 0), n])
        with parallel:
            team = b.alloca(_TEAM)
            for k, value in enumerate([chunk, data, n, ir.Constant(S.I64, 0), ir.Constant(S.I64, 0)]):
                b.store(value, struct_field(b, team, _TEAM, k))        # ..., counter = 0, done
            # 0 threads: libgomp's default (OMP_NUM_THREADS)
            start_team(b, team_function(module), team, struct_field(b, team, _TEAM, 4), ir.Constant(S.I32, 0))
    b.ret_void()
    return fn


def team_function(module: ir.Module) -> ir.Function:
    """`void tracecomp.parallel.team(ptr team)`, what every thread of a runner's team runs
    (defined once per module): the chunks of the iterations it claims, through the loop's
    `.chunk` function in the team struct {chunk, data, n, counter, done}."""
    fn = module.globals.get(_TEAM_FN)
    if fn is not None:
        return fn
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR]), _TEAM_FN)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    team = fn.args[0]
    chunk, data, n = [b.load(struct_field(b, team, _TEAM, k), typ=t) for k, t in enumerate(_TEAM.elements[:3])]
    counter, done = struct_field(b, team, _TEAM, 3), struct_field(b, team, _TEAM, 4)
    with claimed_chunks(b, module, counter, n, chunk_size(b, module, n, CHUNKS_PER_THREAD)) as (tid, lo, hi):
        b.call(chunk, [data, lo, hi])
    mark_done(b, tid, done)
    b.ret_void()
    return fn


def outlined_function(em: FunctionEmitter, captured: list[tuple[str, ir.Value]], name: str,
                      tail: list[tuple[str, ir.Type]]) -> tuple[ir.Function, FunctionEmitter, dict]:
    """An internal, noinline `name(buffers..., sizes..., captured..., tail...)` of the kernel,
    with an emitter for its body and the environment that sees the captured values."""
    extra = [(n, v.type) for n, v in captured] + tail
    fn = declare_kernel_function(em.module, name, em.kernel.buffers, em.kernel.sizes, em.align,
                                 "internal", extra)
    fn.attributes.add("noinline")
    inner = type(em)(em.module, em.kernel, fn, em.align, in_parallel=True)   # the caller's hooks too
    env = inner.entry_env()
    first = len(em.kernel.buffers) + len(em.kernel.sizes)
    env.update((n, arg) for (n, _), arg in zip(captured, fn.args[first:]))
    return fn, inner, env


def _range_function(em: FunctionEmitter, loop: Loop, captured: list[tuple[str, ir.Value]],
                    name: str) -> ir.Function:
    fn, inner, env = outlined_function(em, captured, name, [("lo", S.I64), ("hi", S.I64)])
    lo, hi = fn.args[-2], fn.args[-1]
    inner.serial_loop(loop.var, lo, hi, loop.body, env)
    inner.finish()
    return fn



@contextmanager
def claimed_chunks(b: ir.IRBuilder, module: ir.Module, counter: ir.Value, n: ir.Value,
                   size: ir.Value) -> Iterator[tuple[ir.Value, ir.Value, ir.Value]]:
    """`with claimed_chunks(...) as (tid, lo, hi):` the body runs on every chunk [lo, hi) of
    `size` items out of [0, n) that this OpenMP thread claims (chunk counter++, atomic;
    `counter`, an i64 shared by the team, must be 0 when the region starts).  Every chunk
    runs exactly once; none is reserved for a thread, so one that starts late takes none."""
    thread_num = S.declare(module, "omp_get_thread_num", S.I32, [], attrs=("nounwind",))
    tid = b.sext(b.call(thread_num, []), S.I64)
    fn = b.function
    header, body, done = (fn.append_basic_block(f"chunk.{x}") for x in ("header", "body", "done"))
    b.branch(header)
    b.position_at_end(header)
    lo = b.mul(b.atomic_rmw("add", counter, ir.Constant(S.I64, 1), "monotonic"), size)
    b.cbranch(b.icmp_signed("<", lo, n), body, done)
    b.position_at_end(body)
    yield tid, lo, S.intrinsic(b, "smin", [b.add(lo, size), n])
    b.branch(header)
    b.position_at_end(done)


def _now(b: ir.IRBuilder) -> ir.Value:
    """The time-stamp counter (rdtsc on x86: constant rate, cheap, no system call)."""
    fn = S.declare(b.module, "llvm.readcyclecounter", S.I64, [])
    return b.call(fn, [])


def _global(module: ir.Module, name: str, initial: int) -> ir.GlobalVariable:
    """An internal i64 global of the module, defined on first use."""
    g = module.globals.get(name)
    if g is None:
        g = ir.GlobalVariable(module, S.I64, name)
        g.linkage = "internal"
        g.initializer = ir.Constant(S.I64, initial)
        g.align = 8
    return g


def recently_late(b: ir.IRBuilder) -> ir.Value:
    """i1: the module's serial back-off is running (a team of it was late not long ago)."""
    until = b.load_atomic(_global(b.module, _SERIAL_UNTIL, 0), "monotonic", 8, typ=S.I64)
    return b.icmp_unsigned("<", _now(b), until)


def mark_done(b: ir.IRBuilder, tid: ir.Value, done: ir.Value) -> None:
    """In a team's function, after its chunk loop: the calling thread (tid 0) notes when it
    found no work left, for `start_team`."""
    with b.if_then(b.icmp_signed("==", tid, ir.Constant(S.I64, 0))):
        b.store(_now(b), done)


def start_team(b: ir.IRBuilder, omp_fn: ir.Function, data: ir.Value, done: ir.Value,
               threads: ir.Value) -> None:
    """GOMP_parallel(omp_fn, data, threads); then, if the calling thread waited at the
    closing barrier (from `done`, set by mark_done, to the return) for more than half the
    time it worked plus LATE_MIN_CYCLES, regions of this module run serially for a while."""
    gomp = S.declare(b.module, "GOMP_parallel", ir.VoidType(), [_PTR, _PTR, S.I32, S.I32],
                     attrs=("nounwind",))
    start = _now(b)
    b.call(gomp, [omp_fn, data, threads, ir.Constant(S.I32, 0)])
    end = _now(b)
    finished = b.load(done, typ=S.I64)
    waited, worked = b.sub(end, finished), b.sub(finished, start)
    limit = b.add(b.lshr(worked, ir.Constant(S.I64, 1)), ir.Constant(S.I64, LATE_MIN_CYCLES))
    backoff_slot = _global(b.module, _BACKOFF, BACKOFF_CYCLES)
    backoff = b.load_atomic(backoff_slot, "monotonic", 8, typ=S.I64)
    with b.if_else(b.icmp_signed(">", waited, limit)) as (late, on_time):
        with late:
            b.store_atomic(b.add(end, backoff), _global(b.module, _SERIAL_UNTIL, 0), "monotonic", 8)
            longer = S.intrinsic(b, "umin", [b.shl(backoff, ir.Constant(S.I64, 1)),
                                             ir.Constant(S.I64, MAX_BACKOFF_CYCLES)])
            b.store_atomic(longer, backoff_slot, "monotonic", 8)
        with on_time:
            b.store_atomic(ir.Constant(S.I64, BACKOFF_CYCLES), backoff_slot, "monotonic", 8)


def chunk_size(b: ir.IRBuilder, module: ir.Module, n: ir.Value, per_thread: int) -> ir.Value:
    """ceil(n / (threads * per_thread)), at least 1: the chunk for `per_thread` chunks each."""
    num_threads = S.declare(module, "omp_get_num_threads", S.I32, [], attrs=("nounwind",))
    chunks = b.mul(b.sext(b.call(num_threads, []), S.I64), ir.Constant(S.I64, per_thread))
    size = b.udiv(b.add(n, b.sub(chunks, ir.Constant(S.I64, 1))), chunks)
    return S.intrinsic(b, "smax", [size, ir.Constant(S.I64, 1)])


def struct_field(b: ir.IRBuilder, data: ir.Value, struct: ir.LiteralStructType, k: int) -> ir.Value:
    indices = [ir.Constant(S.I32, 0), ir.Constant(S.I32, k)]
    if data.type.is_opaque:
        return b.gep(data, indices, inbounds=True, source_etype=struct)
    return b.gep(data, indices, inbounds=True)     # llvmlite's allocas are typed pointers


def entry_alloca(em: FunctionEmitter, t: ir.Type) -> ir.Value:
    """A stack slot in the entry block (where LLVM expects allocas), whatever the position."""
    b, here = em.builder, em.builder.block
    b.position_at_start(em.fn.entry_basic_block)
    slot = b.alloca(t)
    b.position_at_end(here)
    return slot


def _inner_work(em: FunctionEmitter, body: Sequence) -> ir.Value:
    """Innermost iterations of one pass over `body` (at least 1): the sum over its loops
    of extent times their own inner work, and m * n * k per Matmul.  A simple estimate;
    every element costs one."""
    total: ir.Value = ir.Constant(S.I64, 0)
    for s in body:
        if isinstance(s, (Loop, Reduce)):
            total = _add(em.builder, total, _mul(em.builder, _bound(em, s.extent), _inner_work(em, s.body)))
        elif isinstance(s, Matmul):
            product: ir.Value = ir.Constant(S.I64, 1)
            for extent in s.extents():              # batch..., m, n, k
                product = _mul(em.builder, product, _bound(em, extent))
            total = _add(em.builder, total, product)
    if isinstance(total, ir.Constant):
        return ir.Constant(S.I64, max(total.constant, 1))
    return S.intrinsic(em.builder, "smax", [total, ir.Constant(S.I64, 1)])


def _bound(em: FunctionEmitter, extent) -> ir.Value:
    """An extent where the parallel loop starts: one that names loop vars inside it (a
    triangular nest's `min(qb + 1, n)`) counts as its constant arm, or 1."""
    if isinstance(extent, int) or var_names(extent) <= set(em.sizes):
        return em.extent(extent)
    if isinstance(extent, Binary) and extent.fn == "minimum":
        for arm in (extent.a, extent.b):
            if isinstance(arm, int) or var_names(arm) <= set(em.sizes):
                return em.extent(arm)
    return ir.Constant(S.I64, 1)


def _mul(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    if isinstance(x, ir.Constant) and isinstance(y, ir.Constant):
        return ir.Constant(S.I64, x.constant * y.constant)
    return b.mul(x, y, flags=("nsw",))


def _add(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    if isinstance(x, ir.Constant) and isinstance(y, ir.Constant):
        return ir.Constant(S.I64, x.constant + y.constant)
    return b.add(x, y, flags=("nsw",))
