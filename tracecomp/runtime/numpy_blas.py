"""NumPy's BLAS threads beside tracecomp's.

After each multithreaded BLAS call, OpenBLAS's idle worker threads (NumPy's BLAS on the
PyPI wheels) spin for 2^28 cycles, about 0.1 s, before they sleep.  A tracecomp kernel that
starts a parallel region in that window finds a core taken, and the spinner, having slept
before, is favoured by the Linux scheduler: a 1024^3 matmul right after a NumPy one took
9.0 ms instead of 4.6 on the 2-core host (on one thread: 8.5).  With the spin cut to 2^16
cycles (~25 us) it took 4.8 ms, and NumPy's own back-to-back matmuls kept their speed at
64^3 to 1024^3 (BENCHMARKS.md, "After NumPy").

OpenBLAS reads OPENBLAS_THREAD_TIMEOUT (log2 of the cycles) once, as NumPy loads it.  So when
tracecomp is imported before NumPy and the user chose no value, it sets 16 for that moment
only (`short_spin_while_numpy_loads`), as runtime/jit.py does for libgomp's own spin: child
processes and other libraries do not see it.  Imported after NumPy, it can change nothing;
`tracecomp info` says so.  `openblas_spin()` reads back what OpenBLAS took.

Imported after NumPy, tracecomp instead gives OpenBLAS its threads: as tracecomp links
parallel code, the jobs of every OpenBLAS loaded by then (NumPy's, SciPy's) start running on
tracecomp's libgomp team (runtime/blas_team.py), whose workers sleep soon after a call, and
OpenBLAS's own threads are never woken again.  `why_not_share()` says when that is not done:
the user chose the spin, or set TRACECOMP_SHARE_BLAS_THREADS=0, or the OpenBLAS has no
threads callback.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
from pathlib import Path
from typing import Iterator, Optional

TIMEOUT_ENV = "OPENBLAS_THREAD_TIMEOUT"
SHORT_SPIN = 16             # log2 of the cycles NumPy's OpenBLAS threads spin once idle
DEFAULT_SPIN = 28           # OpenBLAS's own (THREAD_TIMEOUT)
SHARE_ENV = "TRACECOMP_SHARE_BLAS_THREADS"     # "0": OpenBLAS keeps its own threads
SHARED_MAX_THREADS = 64     # one bit of runtime/blas_team.py's i64 slot mask per OpenBLAS slot
set_by_tracecomp = False
shared: set[str] = set()    # OpenBLAS copies whose jobs run on tracecomp's threads (blas_team)


@contextlib.contextmanager
def short_spin_while_numpy_loads() -> Iterator[None]:
    """Inside: OPENBLAS_THREAD_TIMEOUT=SHORT_SPIN, unless NumPy is loaded already or the user
    set a value."""
    global set_by_tracecomp
    if "numpy" in sys.modules or TIMEOUT_ENV in os.environ:
        yield
        return
    os.environ[TIMEOUT_ENV] = str(SHORT_SPIN)
    try:
        yield
    finally:
        del os.environ[TIMEOUT_ENV]
    set_by_tracecomp = True


def openblas_libraries() -> list[str]:
    """The paths of the OpenBLAS copies this process loaded (NumPy's wheels bring one, SciPy's
    another), NumPy's first."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found = []
    for line in maps.splitlines():
        if "openblas" not in line.lower():      # (looked at every link: keep it cheap)
            continue
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "openblas" in Path(path).name.lower() and ".so" in path and path not in found:
            found.append(path)
    return sorted(found, key=lambda path: "numpy" not in Path(path).parent.name)


def openblas_library() -> Optional[str]:
    """The path of NumPy's OpenBLAS (else of the first OpenBLAS loaded), or None."""
    return next(iter(openblas_libraries()), None)


def openblas(path: Optional[str] = None) -> Optional[ctypes.CDLL]:
    """The OpenBLAS at `path` (default: NumPy's), or None when none is loaded."""
    path = path or openblas_library()
    return None if path is None else ctypes.CDLL(path)


def _function(lib: ctypes.CDLL, names: tuple[str, ...], restype, *argtypes):
    """The first of `names` that `lib` exports (the symbol names depend on the build: NumPy's
    wheels prefix "scipy_" and suffix "64_"), or None."""
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = restype, list(argtypes)
            return fn
    return None


def openblas_spin(path: Optional[str] = None) -> Optional[int]:
    """log2 of the cycles the idle threads of the OpenBLAS at `path` (default: NumPy's) spin
    (what it read as it loaded), or None when no OpenBLAS with that setting is loaded."""
    lib = openblas(path)
    read = lib and _function(lib, ("openblas_thread_timeout",), ctypes.c_int)
    if read is None:
        return None
    value = read()
    return DEFAULT_SPIN if value <= 0 else min(max(value, 4), 30)      # OpenBLAS's clamp


def callback_setter(lib: ctypes.CDLL):
    """OpenBLAS's `openblas_set_threads_callback_function(void *)` (0.3.27 on), or None."""
    return _function(lib, tuple(f"{prefix}openblas_set_threads_callback_function{suffix}"
                                for prefix in ("scipy_", "") for suffix in ("64_", "")),
                     None, ctypes.c_void_p)


def max_threads(lib: ctypes.CDLL) -> Optional[int]:
    """MAX_THREADS of the OpenBLAS build (its per-thread arrays' length), from its config."""
    config = _function(lib, tuple(f"{prefix}openblas_get_config{suffix}"
                                  for prefix in ("scipy_", "") for suffix in ("64_", "")),
                       ctypes.c_char_p)
    found = config and re.search(rb"MAX_THREADS=(\d+)", config() or b"")
    return int(found.group(1)) if found else None


def why_not_share(path: Optional[str] = None) -> Optional[str]:
    """None when the jobs of the OpenBLAS at `path` (default: NumPy's) should run on
    tracecomp's threads; else why not."""
    if os.environ.get(SHARE_ENV) == "0":
        return f"{SHARE_ENV}=0"
    spin = openblas_spin(path)
    if spin is None:
        return "no OpenBLAS that reports its spin is loaded"
    if TIMEOUT_ENV in os.environ:
        return f"{TIMEOUT_ENV} is set by the user"
    if spin <= SHORT_SPIN:
        return f"its idle threads spin 2^{spin} cycles only"
    lib = openblas(path)
    if callback_setter(lib) is None:
        return "this OpenBLAS has no threads callback (0.3.27 and later have)"
    limit = max_threads(lib)
    if limit is None or not 1 <= limit <= SHARED_MAX_THREADS:
        return f"this OpenBLAS's MAX_THREADS ({limit}) is not in 1..{SHARED_MAX_THREADS}"
    return None


def describe() -> str:
    """One line for `tracecomp info`."""
    path = openblas_library()
    spin = openblas_spin(path)
    if spin is None:
        return "NumPy's BLAS: not OpenBLAS (or not loaded)"
    line = f"NumPy's BLAS: OpenBLAS, idle threads spin 2^{spin} cycles"
    others = [Path(p).name for p in shared if p != path]
    also = f"; also on tracecomp's threads: {', '.join(others)}" if others else ""
    if set_by_tracecomp and spin == SHORT_SPIN:
        return f"{line} (set by tracecomp, imported before NumPy){also}"
    if TIMEOUT_ENV in os.environ:
        return f"{line} ({TIMEOUT_ENV} set by the user){also}"
    if path in shared:
        return f"{line}, but its jobs run on tracecomp's threads (NumPy was loaded before tracecomp){also}"
    why = why_not_share(path)
    if why is None:
        return (f"{line}; its jobs will run on tracecomp's threads once tracecomp starts them "
                f"(NumPy was loaded before tracecomp; {SHARE_ENV}=0 keeps OpenBLAS's own){also}")
    if spin == DEFAULT_SPIN:
        return (f"{line} (OpenBLAS's default: NumPy was loaded before tracecomp; {TIMEOUT_ENV}={SHORT_SPIN} "
                f"or importing tracecomp first shortens it; not shared: {why}){also}")
    return line + also
