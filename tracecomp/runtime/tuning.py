"""Choices a model of the CPU cannot make, measured once per CPU and kept beside the
user's compile cache, where every later process finds them.

The matmul's tiles follow from the vector ISA and the caches (lower/schedule/tiles.py),
and the loop vectorizer's width from LLVM's model of the CPU, except for one question on
a CPU with AVX-512: do 512-bit vectors beat 256-bit ones?  Zen 5 runs its matmul 1.9x and
W1's transcendentals 1.5x faster with them; on some Intel CPUs a 512-bit FMA issues on
fewer ports, or lowers the clock, and LLVM tunes rocketlake's loops for 256-bit vectors.
So the question is asked twice, of the matmul's tiles (`matmul_vector_bytes`) and of the
elementwise and row loops LLVM vectorizes (`loop_vector_bytes`, given to LLVM as its
prefer-256-bit feature, hostcpu.host_target).  On an AVX-512 target, the first program
scheduled in a process (`ensure_tuned`, called from stages.Lowered.program) looks for
`<cache folder>/tuning-v2/<cpu key>.json`, then for the same file in the host's tuning
folder (`$TRACECOMP_TUNING_DIR`, else the default compile cache folder's, so a process
on a fresh cache folder, a test's or a project's, does not measure again: that was most
of W5's cold first call); when both are absent it times, with each width, a 384^3
float32 product and W1's x sigmoid(1.702 x) + sin(x) exp(-x^2) over 2^15 floats (on one
thread, in the thread's CPU time, so that other processes on the machine do not tilt it;
interleaved, best of 7 rounds, about 0.4 s once), keeps 512-bit unless 256-bit is more
than MARGIN faster, and stores the choices in both folders.  The first process to store a
record wins:
one that measured at the same time takes the stored choices, so every process sharing the
folder generates the same code.  The key holds the CPU's model name, LLVM's name and
features for it and its caches, so another CPU (or TRACECOMP_TARGET) gets a search of its
own.  The choices are installed with hostcpu.set_tuned before anything is scheduled, so
every tile and loop of the process agrees, and the tiles and the target's features are
part of the compile cache's key.

Nothing is measured with the compile cache off, or with TRACECOMP_TUNE=0 (the ISA's widest
tiles and LLVM's own loop width then); a stored file that does not hold known choices is
measured again.

The probes are not compiled with tc.trace, which would enter the whole compiler again in
the middle of the first compile: they are written as the graphs tc.trace records for them
(MATMUL_PROBE, LOOP_PROBE), parsed, scheduled and JIT compiled here (`probe_program`,
CompiledProgram), and timed through the compiled program's own call.  Each candidate width
is installed with hostcpu.set_tuned while its probe is scheduled and compiled, and the
setting before is put back afterwards: the scheduler's tiles and LLVM's target machine
both read that process-wide setting, and passing the width to them instead would thread a
parameter through tiles, scheduler, code generation and target machine for this one use.
No other program is compiled meanwhile: the first compile is waiting on this one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..ir.verifier import verify
from ..lower import hostcpu
from ..lower.schedule.scheduler import Program, schedule
from . import amx, cache, jit
from .compiled import CompiledProgram

log = logging.getLogger("tracecomp.tuning")

TUNE_ENV = "TRACECOMP_TUNE"
TUNING_DIR_ENV = "TRACECOMP_TUNING_DIR"
VERSION = 2
MARGIN = 0.10          # 256-bit vectors must be this much faster to be chosen over 512-bit
PROBE_N = 384          # the probe product: PROBE_N^3 float32, ~0.1 GFLOP
LOOP_PROBE_N = 1 << 15  # the probe loop's floats: 128 KiB in, 128 KiB out, in L2
ROUNDS, CALLS = 7, 3
_lock = threading.Lock()
_done = False
_installed: Optional[dict] = None     # the choices this process uses
_recorded_in: set = set()             # cache folders known to hold a record

# The probes, as tc.trace records `a @ b` and W1's x * (1.702 * x).sigmoid() + x.sin() * (-x * x).exp()
MATMUL_PROBE = """func.func @tuning_matmul(%a: SQUARE, %b: SQUARE) -> (SQUARE) {
  %0 = "tc.matmul"(%a, %b) : (SQUARE, SQUARE) -> SQUARE
  return %0 : SQUARE
}""".replace("SQUARE", f"tensor<{PROBE_N}x{PROBE_N}xf32>")
LOOP_PROBE = """func.func @tuning_loop(%x: ROW) -> (ROW) {
  %0 = "tc.mul"(%x) {other = 1.702 : f64} : (ROW) -> ROW
  %1 = "tc.sigmoid"(%0) : (ROW) -> ROW
  %2 = "tc.mul"(%x, %1) : (ROW, ROW) -> ROW
  %3 = "tc.sin"(%x) : (ROW) -> ROW
  %4 = "tc.neg"(%x) : (ROW) -> ROW
  %5 = "tc.mul"(%4, %x) : (ROW, ROW) -> ROW
  %6 = "tc.exp"(%5) : (ROW) -> ROW
  %7 = "tc.mul"(%3, %6) : (ROW, ROW) -> ROW
  %8 = "tc.add"(%2, %7) {alpha = 1 : i64} : (ROW, ROW) -> ROW
  return %8 : ROW
}""".replace("ROW", f"tensor<{LOOP_PROBE_N}xf32>")


def cpu_key() -> str:
    """What the choice depends on: the CPU's model and caches, LLVM's name and features for it."""
    t = hostcpu.detected_target()
    text = json.dumps([VERSION, hostcpu.cpu_model(), t.cpu, t.features, hostcpu.caches()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def record_path(directory=None):
    return (directory or cache.settings.directory) / f"tuning-v{VERSION}" / f"{cpu_key()}.json"


def host_folder() -> Path:
    """The folder whose record every process on this host finds, whatever compile cache
    folder it uses: `$TRACECOMP_TUNING_DIR`, else the default compile cache folder."""
    if os.environ.get(TUNING_DIR_ENV):
        return Path(os.environ[TUNING_DIR_ENV])
    return cache.default_directory()


CHOICES = ("matmul_vector_bytes", "loop_vector_bytes")


def candidates() -> tuple[int, ...]:
    """The vector widths (bytes) to choose between: 512- and 256-bit on AVX-512."""
    return (64, 32) if hostcpu.host_target().has("avx512f") else ()


def ensure_tuned() -> None:
    """Install this CPU's measured choices (measuring them if no record exists), once per
    process; nothing to do when there is nothing to choose, the cache is off or
    TRACECOMP_TUNE=0.  First, on a CPU with AMX, ask Linux for the tile state (the AMX
    matmul paths are chosen only where it is granted)."""
    global _done, _installed
    if _done:
        return
    with _lock:
        if _done:
            return
        _done = True        # first: a measurement that failed is not tried again at every compile
        if hostcpu.detected_target().has("amx-tile"):     # the AMX paths run only if Linux grants the tiles
            hostcpu.set_tile_data_granted(amx.request_tile_data())
        if not candidates() or not cache.switched_on(TUNE_ENV) or not cache.settings.enabled:
            return
        here, host = cache.settings.directory, host_folder()
        choices = load_record(here)
        if choices is None:
            choices = load_record(host)
            if choices is None:
                choices = store_record(measure(), host)
            if here != host:
                choices = store_record(choices, here)
        hostcpu.set_tuned(choices)
        _installed = choices
        _recorded_in.update((here, host))
        cache.folder_used.append(leave_record)    # (the cache cannot import this module)


def leave_record(directory) -> None:
    """Called by the compile cache for each folder it uses, once ensure_tuned installed
    choices (it registers this in cache.folder_used): a process that moved to another
    folder (a cluster's shared one, say) keeps its choices, since all its tiles must agree,
    and leaves them there when the folder has none, so that processes starting on that
    folder need not measure again."""
    if _installed is None or directory in _recorded_in:
        return
    with _lock:
        _recorded_in.add(directory)
        if load_record(directory) is None:
            store_record(_installed, directory)


def load_record(directory=None) -> Optional[dict]:
    from ..core.safe_files import read_regular
    try:          # a regular file only: a FIFO there would block every process's first compile
        choices = json.loads(read_regular(record_path(directory), 1 << 16))
    except (OSError, ValueError):
        return None
    if not isinstance(choices, dict) or any(choices.get(name) not in candidates() for name in CHOICES):
        return None
    return choices


def store_record(choices: dict, directory=None) -> dict:
    """Store `choices` unless another process stored a record first; the choices to use."""
    path = record_path(directory)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(choices, sort_keys=True) + "\n")
        os.link(tmp, path)                  # fails if the record exists: the first one stays
    except FileExistsError:
        return load_record(directory) or choices
    except OSError as e:
        log.warning("tuning: could not store %s (%s); measured again by the next process", path, e)
    finally:
        try:
            tmp.unlink()
        except OSError:                     # never written (the folder could not be made)
            pass
    return choices


def probe_program(text: str) -> Program:
    """A probe's graph, written as text, scheduled as tc.trace schedules a traced graph."""
    from ..ir.parser import parse_graph     # here: only a measuring process needs it (7 ms at import)
    graph = parse_graph(text, "<probe>")
    verify(graph)
    return schedule(graph)


def measure() -> dict:
    """Time the probes with each candidate width; the choices and the times."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((PROBE_N, PROBE_N)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal(LOOP_PROBE_N).astype(np.float32)
    chosen: dict = {}
    times: dict = {}
    before = hostcpu.tuned()
    try:
        for name, text, inputs in (("matmul_vector_bytes", MATMUL_PROBE, [a, b]), ("loop_vector_bytes", LOOP_PROBE, [x])):
            calls = {}
            with cache.settings.off():          # the probes are compiled once ever: not worth keeping
                for width in candidates():
                    # the tiles (at scheduling) and LLVM's target (at compiling) read the width here
                    hostcpu.set_tuned({**chosen, name: width})
                    calls[width] = CompiledProgram(probe_program(text))
                    calls[width](inputs)                   # fault the outputs in
            best = _best_times(calls, inputs)
            chosen[name] = decide(best)
            times[name.replace("_vector_bytes", "")] = {str(w * 8): round(t * 1e3, 4) for w, t in best.items()}
            log.info("tuning: %s %d-bit (%s)", name, chosen[name] * 8,
                     ", ".join(f"{w * 8}-bit {t * 1e3:.3f} ms" for w, t in best.items()))
    finally:
        hostcpu.set_tuned(before)              # ensure_tuned installs the choices
    return {**chosen, "measured_ms": times}


def _best_times(calls: dict, inputs: list) -> dict:
    """Each width's best time per call, on one thread, rounds interleaved so that every
    width sees the same conditions."""
    best = {width: float("inf") for width in calls}
    with jit.one_thread():
        for _ in range(ROUNDS):
            for width, f in calls.items():
                t0 = time.thread_time()
                for _ in range(CALLS):
                    f(inputs)
                best[width] = min(best[width], (time.thread_time() - t0) / CALLS)
    return best


def decide(seconds: dict) -> int:
    """The vector width (bytes) to use from the probe's best time per width: the widest,
    unless a narrower one is more than MARGIN faster (then the fastest)."""
    widest = max(seconds)
    fastest = min(seconds, key=seconds.get)
    return fastest if seconds[fastest] < seconds[widest] * (1 - MARGIN) else widest
