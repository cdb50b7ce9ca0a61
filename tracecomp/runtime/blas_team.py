"""OpenBLAS's jobs (NumPy's, SciPy's) run on tracecomp's thread team (libgomp's), not on
OpenBLAS's own.

When NumPy was loaded before tracecomp, OpenBLAS's idle threads spin for 2^28 cycles (about
0.1 s) after every multithreaded call, and a tracecomp kernel that starts its team in that
window gets one core of two (numpy_blas.py).  OpenBLAS (0.3.27 and later) lets a program
run its jobs instead: `openblas_set_threads_callback_function(cb)` makes every later
`exec_blas(n, queue)` call `cb(sync, dojob, n, size, queue, arg)`, and `cb` must run
`dojob(slot_j, queue + j * size, arg)` for j in [0, n), all at once (a level-3 job waits
for the others' packed panels) and return when they are done.  Here `cb` is
`tracecomp_openblas_threads`, JIT-compiled from the LLVM IR below, which in C reads:

    void tracecomp_openblas_threads(int sync, dojob_fn dojob, int n, size_t size,
                                    char *queue, int arg) {
        struct call c = {dojob, queue, size, n, arg};
        claim_slots(&c);                  // c.slot[j]: n numbers no other call is using
        GOMP_parallel(team, &c, min(n, omp_get_max_threads()), 0);
        release_slots(&c);
    }
    static void team(struct call *c) {    // on each thread of libgomp's team
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        if (t == 0) {                     // jobs the team has no thread for get one of their own
            for (int j = T; j < c->n; j++) pthread_create(&helper[j], 0, run_helper, ...);
            run_job(c, 0);
            for (int j = T; j < c->n; j++) pthread_join(helper[j], 0);
        } else if (t < c->n) run_job(c, t);
    }

Why each part:
- Slots.  `dojob`'s first argument picks OpenBLAS's per-thread state and packing buffer
  (`thread_status[slot]`, `blas_thread_buffer[slot]`, MAX_THREADS of each).  OpenBLAS lets
  several threads call it at once, and LU (getrf) still runs on its own threads, which are
  numbered from 0.  So each call claims, with one compare-and-swap on a bit mask, n slot
  numbers that no call in flight holds, the highest free ones first, and releases them at
  the end.  OpenBLAS never makes more jobs than MAX_THREADS, so the mask covers all of them
  (numpy_blas.py shares only with an OpenBLAS of at most 64), and a call waits only while
  other calls hold slots.
- A team smaller than n.  libgomp gives one thread to a region nested in another, fewer to
  OMP_NUM_THREADS or `jit.one_thread()`, and one in a forked child (runtime/jit.py); the
  missing jobs then run on fresh POSIX threads, because a job may wait for all the others.
- After the call, libgomp's workers spin briefly (jit.GOMP_SPINCOUNT) and sleep; the next
  tracecomp kernel finds them there, and OpenBLAS's own threads, never woken again, sleep.
- pthread_create failing (EAGAIN: the process is out of threads for the moment) is retried
  after a yield: a job that never starts would leave the others waiting for it forever.
- Each OpenBLAS copy in the process gets its own compiled callback (its own slot mask), as
  tracecomp links parallel code: a library imported after the first link is found at the
  next (the process's maps are read again only after an import).
"""
from __future__ import annotations

import atexit
import ctypes
import sys
import threading

from . import numpy_blas

CALLBACK = "tracecomp_openblas_threads"
MASK_SLOTS = numpy_blas.SHARED_MAX_THREADS      # slot numbers the i64 mask covers: 64

_IR = """
; struct call {{ dojob, queue, size, n, arg, slot[MAX] }}   struct helper {{ call, job, pthread_t }}
%call = type {{ ptr, ptr, i64, i32, i32, [{slots} x i32] }}
%helper = type {{ ptr, i32, i64 }}

@slots_in_use = internal global i64 0, align 8

declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_thread_num()
declare i32 @omp_get_num_threads()
declare i32 @omp_get_max_threads()
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_join(i64, ptr)
declare i32 @sched_yield()
declare i64 @llvm.ctlz.i64(i64, i1)
declare i64 @llvm.ctpop.i64(i64)
declare i32 @llvm.smin.i32(i32, i32)

define void @{callback}(i32 %sync, ptr %dojob, i32 %n, i64 %size, ptr %queue, i32 %arg) {{
entry:
  %c = alloca %call, align 8
  store ptr %dojob, ptr %c
  %queue.p = getelementptr %call, ptr %c, i32 0, i32 1
  store ptr %queue, ptr %queue.p
  %size.p = getelementptr %call, ptr %c, i32 0, i32 2
  store i64 %size, ptr %size.p
  %n.p = getelementptr %call, ptr %c, i32 0, i32 3
  store i32 %n, ptr %n.p
  %arg.p = getelementptr %call, ptr %c, i32 0, i32 4
  store i32 %arg, ptr %arg.p
  %n64 = sext i32 %n to i64
  br label %claim

claim:                                  ; wait until n slots are free, then take the highest
  %old = load atomic i64, ptr @slots_in_use monotonic, align 8
  %free = xor i64 %old, {all_slots}
  %free.count = call i64 @llvm.ctpop.i64(i64 %free)
  %enough = icmp sge i64 %free.count, %n64
  br i1 %enough, label %pick, label %wait

wait:
  %ignored = call i32 @sched_yield()
  br label %claim

pick:
  %j = phi i32 [ 0, %claim ], [ %j.next, %pick.one ]
  %left = phi i64 [ %free, %claim ], [ %left.next, %pick.one ]
  %picked = phi i64 [ 0, %claim ], [ %picked.next, %pick.one ]
  %more = icmp slt i32 %j, %n
  br i1 %more, label %pick.one, label %take

pick.one:
  %zeros = call i64 @llvm.ctlz.i64(i64 %left, i1 true)
  %bit.index = sub i64 63, %zeros
  %bit = shl i64 1, %bit.index
  %left.next = xor i64 %left, %bit
  %picked.next = or i64 %picked, %bit
  %slot = trunc i64 %bit.index to i32
  %slot.p = getelementptr %call, ptr %c, i32 0, i32 5, i32 %j
  store i32 %slot, ptr %slot.p
  %j.next = add i32 %j, 1
  br label %pick

take:
  %taken = or i64 %old, %picked
  %swap = cmpxchg ptr @slots_in_use, i64 %old, i64 %taken acq_rel monotonic
  %swapped = extractvalue {{ i64, i1 }} %swap, 1
  br i1 %swapped, label %run, label %claim

run:
  %max = call i32 @omp_get_max_threads()
  %threads = call i32 @llvm.smin.i32(i32 %n, i32 %max)
  call void @GOMP_parallel(ptr @team, ptr %c, i32 %threads, i32 0)
  %keep = xor i64 %picked, -1
  %before = atomicrmw and ptr @slots_in_use, i64 %keep release
  ret void
}}

define internal void @run_job(ptr %c, i32 %j) {{
  %dojob = load ptr, ptr %c
  %queue.p = getelementptr %call, ptr %c, i32 0, i32 1
  %queue = load ptr, ptr %queue.p
  %size.p = getelementptr %call, ptr %c, i32 0, i32 2
  %size = load i64, ptr %size.p
  %arg.p = getelementptr %call, ptr %c, i32 0, i32 4
  %arg = load i32, ptr %arg.p
  %slot.p = getelementptr %call, ptr %c, i32 0, i32 5, i32 %j
  %slot = load i32, ptr %slot.p
  %j64 = sext i32 %j to i64
  %offset = mul i64 %j64, %size
  %job = getelementptr i8, ptr %queue, i64 %offset
  call void %dojob(i32 %slot, ptr %job, i32 %arg)
  ret void
}}

define internal ptr @run_helper(ptr %h) {{
  %c = load ptr, ptr %h
  %job.p = getelementptr %helper, ptr %h, i32 0, i32 1
  %job = load i32, ptr %job.p
  call void @run_job(ptr %c, i32 %job)
  ret ptr null
}}

define internal void @team(ptr %c) {{
entry:
  %helpers = alloca [{slots} x %helper], align 8
  %t = call i32 @omp_get_thread_num()
  %team = call i32 @omp_get_num_threads()
  %n.p = getelementptr %call, ptr %c, i32 0, i32 3
  %n = load i32, ptr %n.p
  %first = icmp eq i32 %t, 0
  br i1 %first, label %start, label %other

other:
  %has.job = icmp slt i32 %t, %n
  br i1 %has.job, label %own.job, label %done

own.job:
  call void @run_job(ptr %c, i32 %t)
  br label %done

start:                                  ; a helper thread for each job from `team` on
  %j = phi i32 [ %team, %entry ], [ %j.next, %created.one ]
  %more = icmp slt i32 %j, %n
  br i1 %more, label %start.one, label %job.zero

start.one:
  %h = getelementptr [{slots} x %helper], ptr %helpers, i32 0, i32 %j
  store ptr %c, ptr %h
  %h.job = getelementptr %helper, ptr %h, i32 0, i32 1
  store i32 %j, ptr %h.job
  %h.thread = getelementptr %helper, ptr %h, i32 0, i32 2
  br label %create

create:                                 ; out of threads for now (EAGAIN): try again
  %created = call i32 @pthread_create(ptr %h.thread, ptr null, ptr @run_helper, ptr %h)
  %failed = icmp ne i32 %created, 0
  br i1 %failed, label %create.wait, label %created.one

create.wait:
  %ignored = call i32 @sched_yield()
  br label %create

created.one:
  %j.next = add i32 %j, 1
  br label %start

job.zero:
  call void @run_job(ptr %c, i32 0)
  br label %join

join:
  %k = phi i32 [ %team, %job.zero ], [ %k.next, %join.one ]
  %more.joins = icmp slt i32 %k, %n
  br i1 %more.joins, label %join.one, label %done

join.one:
  %jh = getelementptr [{slots} x %helper], ptr %helpers, i32 0, i32 %k, i32 2
  %thread = load i64, ptr %jh
  %joined = call i32 @pthread_join(i64 %thread, ptr null)
  %k.next = add i32 %k, 1
  br label %join

done:
  ret void
}}
"""


def module_text(max_threads: int) -> str:
    """The callback's LLVM IR for an OpenBLAS built with MAX_THREADS = `max_threads` (at most
    MASK_SLOTS: one bit of the mask per slot)."""
    if not 1 <= max_threads <= MASK_SLOTS:
        raise ValueError(f"an OpenBLAS of MAX_THREADS={max_threads} has more slots than the "
                         f"callback's mask ({MASK_SLOTS})")
    all_slots = -1 if max_threads == MASK_SLOTS else (1 << max_threads) - 1
    return _IR.format(callback=CALLBACK, slots=max_threads, all_slots=all_slots)


_lock = threading.RLock()      # re-entered by the thread that links a callback
_seen: set[str] = set()         # OpenBLAS copies already looked at
_modules_seen = -1              # len(sys.modules) at the last look (OpenBLAS comes with imports)
_libraries = []                 # the JitLibraries holding the callbacks, alive for the process's life


def share_openblas_threads(engine) -> None:
    """As tracecomp links parallel code (with `engine`, a jit.JitEngine): every OpenBLAS
    loaded since the last look runs its jobs on tracecomp's team from then on, unless
    `numpy_blas.why_not_share` says otherwise.  Each copy gets a callback of its own (its
    slot numbers are its own).  At exit OpenBLAS gets its threads back, so that no call
    reaches a callback's code while the JIT tears down."""
    global _modules_seen
    with _lock:
        if len(sys.modules) == _modules_seen:   # nothing imported since: reading the maps costs ~1 ms
            return
        _modules_seen = len(sys.modules)
        for path in numpy_blas.openblas_libraries():
            if path in _seen:
                continue
            _seen.add(path)        # before compiling: linking the callback comes back here
            if numpy_blas.why_not_share(path) is not None:
                continue
            lib = numpy_blas.openblas(path)
            library = engine.compile(module_text(numpy_blas.max_threads(lib)), [CALLBACK])
            set_callback = numpy_blas.callback_setter(lib)
            set_callback(ctypes.c_void_p(library.address(CALLBACK)))
            _libraries.append(library)
            numpy_blas.shared.add(path)
            atexit.register(set_callback, None)
