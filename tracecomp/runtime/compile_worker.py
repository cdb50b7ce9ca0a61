"""Compiling a module's kernels on two cores: a forked worker process compiles part of them.

llvmlite serializes every LLVM call of a process (target.LLVM_LOCK, and LLVM's global
context), so threads cannot compile in parallel; processes can.  For a module big enough
to be worth it, `compile_kernels_object` splits the kernels into groups of about equal
estimated LLVM work, forks one worker per extra group, compiles the first group itself,
and links all the object files into one library (jit.ObjectCode holds several objects;
the compile cache stores them as one entry).  A fork copies the process, so the worker
needs no imports and no pickling: it generates, optimizes and emits its group and writes
the object (and a JSON header) into a pipe.  Each group is a module of its own: the matmul
helpers (micro-kernel, packing) are compiled once per group that has a product.

When it runs: on Linux (os.fork), with at least two CPUs this process may use, a process
of at most FORK_MAX_RSS resident bytes, and a module of at least MIN_SPLIT_WEIGHT
(estimated ~30 ms of work; fork, pipe and wait cost a few ms).  `TRACECOMP_COMPILE_PROCESSES=1` turns it off; a larger number allows
that many processes (default: 2, or 1 with one CPU).

Robustness:
- the fork happens while this thread holds target.LLVM_LOCK and jit's library-loading
  lock, so no thread of this process is inside LLVM (whose internal locks a child would
  inherit held) or loading a system library; the worker only runs
  Python code generation and LLVM, never libgomp or the JIT linker, and leaves with
  os._exit (no atexit handlers, no flushing of inherited stdio buffers);
- a worker that fails (any exception), dies, or has not answered within
  max(WORKER_TIMEOUT_MIN_S, WORKER_TIMEOUT_FACTOR x this process's own compile time) is
  killed if needed and its group is compiled here instead, so a real compile error is
  raised here with its ordinary message and traceback; a fork that fails (ENOMEM) also
  falls back to compiling here;
- this process waits for its workers in a `finally`: an exception or KeyboardInterrupt in
  its own part kills and reaps them, none is left behind.
Stages (timings.py): the time this process waits for a worker after its own part counts
as machine_code.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import select
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

from ..core import timings
from ..lower.llvm.codegen import codegen_kernels
from ..lower.llvm.gemm.nest import define_helpers, helper_names
from ..lower.llvm.gemm.microkernel import defined_elsewhere_dtypes, helpers_defined_elsewhere
from ..lower.llvm.math.functions import math_calls
from ..lower.loops.ir import Kernel, Matmul
from ..lower.loops.walk import fingerprint, statements
from ..lower.schedule.tiles import PACKED_DTYPES
from . import jit
from ..lower.llvm import target

log = logging.getLogger("tracecomp.compile_worker")

PROCESSES_ENV = "TRACECOMP_COMPILE_PROCESSES"
# Weights: about 0.01 ms of code generation and LLVM work each, fitted to W4's kernels
# compiled one per module (the fit: BENCHMARKS.md, "Figures that were in the code"); since
# LLVM unrolls only where asked and parallel loops share a runner, ~0.008 ms.  Refitted to
# W8's step (its kernels compiled one per module): ~11 ms a kernel, 13 ms more a product,
# 17 ms more a math function applied (inlined and vectorized where it is used: the GELU
# derivative's product took 130-190 ms, estimated 50 ms without this term).  The helpers:
# 18500-26000 units of W4's and W8's kernels alone, more in W8's split.
MIN_SPLIT_WEIGHT = 4000          # ~30 ms
KERNEL_WEIGHT = 600              # a function through the pass pipeline, however small
MATMUL_WEIGHT = 1500             # a product's dispatch, work-item and epilogue functions
MATH_WEIGHT = 2000               # a math function's polynomial, inlined where it is called
HELPERS_WEIGHT = 24000           # the loop nest, micro-kernel, packing and merge of one dtype (~190 ms)
LAZY_CODEGEN_MODULES = ("tracecomp.lower.llvm.gemm.matmul", "tracecomp.lower.llvm.parallel", "tracecomp.lower.llvm.math.functions")
FORK_MAX_RSS = 2 << 30           # a bigger process compiles alone
WORKER_TIMEOUT_MIN_S = 30.0
WORKER_TIMEOUT_FACTOR = 5.0


@dataclass
class _Worker:
    pid: int
    fd: int               # read end of its pipe
    kernels: list[Kernel]
    module_name: str


_compiled_modules = 0    # modules this process sent through LLVM (compiled_modules())


def compiled_modules() -> int:
    """How many modules this process has compiled with LLVM: a test's proof that code came
    from the compile cache (a Dask worker loading what another compiled, say)."""
    return _compiled_modules


def compile_kernels_object(engine: jit.JitEngine, kernels: Sequence[Kernel], module_name: str, *,
                           align: Optional[int], fastmath: Sequence[str] = (),
                           texts: Optional[Sequence[str]] = None) -> jit.ObjectCode:
    """The object code of `kernels` (one module, or one object per group of them); `texts`:
    their fingerprints when the caller has them (the cache's kernel_shape_text), for the split."""
    global _compiled_modules
    _compiled_modules += 1
    shared = packed_matmul_dtypes(kernels)
    groups = split(list(kernels), allowed_processes(), preload=HELPERS_WEIGHT * len(shared), texts=texts)
    if len(groups) == 1:
        return _compile(engine, kernels, module_name, align, fastmath)
    names = [module_name] + [f"{module_name}.part{i}" for i in range(1, len(groups))]
    _import_code_generators()
    with helpers_defined_elsewhere(shared):
        return _compile_groups(engine, groups, names, align, fastmath, shared)


def _compile_groups(engine, groups, names, align, fastmath, shared) -> jit.ObjectCode:
    """Group 0 here (with the matmul helpers of the `shared` dtypes), the others on workers."""
    workers = []
    try:
        for group, name in zip(groups[1:], names[1:]):
            worker = _start_worker(engine, group, name, align, fastmath)
            if worker is not None:
                workers.append(worker)
        started = time.perf_counter()
        parts = [_compile(engine, groups[0], names[0], align, fastmath, define=shared)]
        own = time.perf_counter() - started
        timeout = max(WORKER_TIMEOUT_MIN_S, WORKER_TIMEOUT_FACTOR * own)
        answers = {}
        with timings.stage("machine_code"):
            for worker in workers:
                answers[worker.module_name] = _answer(worker, time.perf_counter() + timeout)
        log.debug("compiled %s: %d kernels here in %.1f ms, %s; waited %.1f ms", names[0],
                  len(groups[0]), own * 1e3, ", ".join(f"{len(w.kernels)} in worker {w.pid}" for w in workers),
                  (time.perf_counter() - started - own) * 1e3)
    finally:
        for worker in workers:
            _reap(worker)
    for group, name in zip(groups[1:], names[1:]):
        code = answers.get(name)
        if code is None:        # no worker, or it failed: compile here (errors raise here)
            code = _compile(engine, group, name, align, fastmath)
        parts.append(code)
    return jit.ObjectCode.joined(parts)


def _import_code_generators() -> None:
    """Import the modules code generation imports on first use, before forking: else
    every worker imports them again (~30 ms when Python compiles them from source)."""
    for name in LAZY_CODEGEN_MODULES:
        importlib.import_module(name)


def _compile(engine: jit.JitEngine, kernels: Sequence[Kernel], module_name: str,
             align: Optional[int], fastmath: Sequence[str], define: Sequence = ()) -> jit.ObjectCode:
    """The kernels' object code; with `define`, also the matmul helpers of those dtypes,
    which the groups compiled under helpers_defined_elsewhere only declare."""
    module = codegen_kernels(kernels, module_name, align=align, fastmath=fastmath)
    if define:
        define_helpers(module, define)
    elsewhere = helper_names(defined_elsewhere_dtypes()) if not define else ()
    return engine.compile_object(module, [k.name for k in kernels], defined_elsewhere=elsewhere)


def packed_matmul_dtypes(kernels: Sequence[Kernel]) -> list:
    """The dtypes of the products that may run the packed kernel (a workspace, a float
    dtype with tiles): the helpers a split module shares.  Over-approximating only costs
    compiling helpers nobody calls."""
    dtypes = set()
    for kernel in kernels:
        for s in statements(kernel.body):
            if isinstance(s, Matmul) and s.workspace is not None:
                dtype = kernel.buffer(s.out.buffer).dtype
                if dtype in PACKED_DTYPES:
                    dtypes.add(dtype)
    return sorted(dtypes, key=str)


# ----------------------------------------------------------------------------- splitting

def allowed_processes() -> int:
    """Processes that may compile one module: TRACECOMP_COMPILE_PROCESSES, else 2 when this
    process may run on two CPUs or more; always 1 without os.fork, off Linux, or in a
    process of more than FORK_MAX_RSS bytes (fork copies its page tables: ~25 ms per GiB)."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux") or _resident_bytes() > FORK_MAX_RSS:
        return 1
    setting = os.environ.get(PROCESSES_ENV, "").strip()
    if setting:
        try:
            return max(1, int(setting))
        except ValueError:
            log.warning("%s=%r is not a number; compiling in one process", PROCESSES_ENV, setting)
            return 1
    return min(2, len(os.sched_getaffinity(0)))


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def kernel_weight(kernel: Kernel, text: Optional[str] = None) -> int:
    """Estimated compile work of a kernel: the size of its loop IR (`text`, its fingerprint,
    computed here if not given), plus MATMUL_WEIGHT per Matmul statement (whose code is
    larger than its loop IR), MATH_WEIGHT per math function applied, and KERNEL_WEIGHT."""
    if text is None:
        text = fingerprint(kernel)      # a shared subexpression counts once, as it compiles once
    return len(text) + MATMUL_WEIGHT * text.count("Matmul(") + MATH_WEIGHT * math_calls(kernel.body) + KERNEL_WEIGHT


def split(kernels: list[Kernel], processes: int, preload: int = 0,
          texts: Optional[Sequence[str]] = None) -> list[list[Kernel]]:
    """Up to `processes` groups of about equal weight, each in the kernels' order: the
    heaviest kernel first to the lightest group; group 0 starts at `preload` (the matmul
    helpers it compiles for all).  One group when the module is light."""
    weights = {id(k): kernel_weight(k, t) for k, t in zip(kernels, texts or [None] * len(kernels))}
    count = min(processes, len(kernels), max(1, sum(weights.values()) // MIN_SPLIT_WEIGHT))
    if count <= 1:
        return [kernels]
    loads, members = [preload] + [0] * (count - 1), [set() for _ in range(count)]
    for k in sorted(kernels, key=lambda k: -weights[id(k)]):
        lightest = loads.index(min(loads))
        loads[lightest] += weights[id(k)]
        members[lightest].add(id(k))
    return [[k for k in kernels if id(k) in group] for group in members]


# ----------------------------------------------------------------------------- workers

def _start_worker(engine, kernels, module_name, align, fastmath) -> Optional[_Worker]:
    """Fork a process compiling `kernels` into the write end of a pipe; None if fork fails.
    The pipe is made and its write end closed here under the locks, so that no other
    worker (forked by another thread) inherits it and holds it open."""
    with target.LLVM_LOCK, jit.load_lock(), warnings.catch_warnings():
        # Python 3.12+ warns on fork in a process with threads (libgomp's, the user's);
        # the worker takes no lock another thread may hold (see the docstring).
        warnings.simplefilter("ignore", DeprecationWarning)
        read_fd, write_fd = os.pipe()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(read_fd)
            os.close(write_fd)
            log.info("compile worker: fork failed (%s); compiling %s here", e, module_name)
            return None
        if pid != 0:
            os.close(write_fd)
    if pid == 0:              # the worker, its copies of the locks released by the `with`
        os.close(read_fd)
        _worker_main(engine, kernels, module_name, align, fastmath, write_fd)
    return _Worker(pid, read_fd, kernels, module_name)


def _worker_main(engine, kernels, module_name, align, fastmath, fd: int) -> None:
    """Compile, write `header JSON \\n object` to fd, and leave the process (never returns)."""
    status = 1
    try:
        try:
            started = time.perf_counter()
            code = _compile(engine, kernels, module_name, align, fastmath)
            header = {"ok": True, "exports": list(code.exports), "size": len(code.object),
                      "seconds": time.perf_counter() - started,
                      "system_libraries": list(code.system_libraries),
                      "object_sizes": list(code.object_sizes)}
            payload = code.object
        except BaseException as e:                 # reported, then compiled again by the parent
            header, payload = {"ok": False, "error": f"{type(e).__name__}: {e}"}, b""
        _write_all(fd, json.dumps(header).encode() + b"\n" + payload)
        status = 0
    finally:
        os._exit(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _answer(worker: _Worker, deadline: float) -> Optional[jit.ObjectCode]:
    """The worker's object code; None (logged) if it failed, died or missed the deadline."""
    data = _read_until_eof(worker.fd, deadline)
    if data is None:
        log.warning("compile worker %d compiling %s did not answer in time; compiling it here",
                    worker.pid, worker.module_name)
        return None
    header, _, payload = data.partition(b"\n")
    try:
        meta = json.loads(header)
    except ValueError:
        log.warning("compile worker %d compiling %s ended without an answer; compiling it here",
                    worker.pid, worker.module_name)
        return None
    log.debug("compile worker %d compiled %s in %.1f ms", worker.pid, worker.module_name,
              meta.get("seconds", 0) * 1e3)
    if not meta.get("ok"):
        log.info("compile worker %d failed on %s (%s); compiling it here", worker.pid,
                 worker.module_name, meta.get("error"))
        return None
    if meta["size"] != len(payload):
        log.warning("compile worker %d sent %d of %d bytes for %s; compiling it here", worker.pid,
                    len(payload), meta["size"], worker.module_name)
        return None
    return jit.ObjectCode(payload, tuple(meta["exports"]), tuple(meta["system_libraries"]),
                          tuple(meta["object_sizes"]))


def _read_until_eof(fd: int, deadline: float) -> Optional[bytes]:
    chunks = []
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(worker: _Worker) -> None:
    """Close the pipe, and kill (if still running) and wait for the worker."""
    os.close(worker.fd)
    try:
        pid, _ = os.waitpid(worker.pid, os.WNOHANG)
        if pid == 0:
            os.kill(worker.pid, signal.SIGKILL)
            os.waitpid(worker.pid, 0)
    except ChildProcessError:
        pass
