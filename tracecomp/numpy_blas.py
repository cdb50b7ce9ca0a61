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
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path
from typing import Iterator, Optional

TIMEOUT_ENV = "OPENBLAS_THREAD_TIMEOUT"
SHORT_SPIN = 16             # log2 of the cycles NumPy's OpenBLAS threads spin once idle
DEFAULT_SPIN = 28           # OpenBLAS's own (THREAD_TIMEOUT)
set_by_tracecomp = False


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


def openblas_library() -> Optional[str]:
    """The path of the OpenBLAS this process loaded (NumPy's), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "openblas" in Path(path).name.lower() and ".so" in path:
            return path
    return None


def openblas_spin() -> Optional[int]:
    """log2 of the cycles the loaded OpenBLAS's idle threads spin (what it read as it
    loaded), or None when no OpenBLAS with that setting is loaded."""
    path = openblas_library()
    if path is None:
        return None
    read = getattr(ctypes.CDLL(path), "openblas_thread_timeout", None)
    if read is None:
        return None
    read.restype, read.argtypes = ctypes.c_int, []
    value = read()
    return DEFAULT_SPIN if value <= 0 else min(max(value, 4), 30)      # OpenBLAS's clamp


def describe() -> str:
    """One line for `tracecomp info`."""
    spin = openblas_spin()
    if spin is None:
        return "NumPy's BLAS: not OpenBLAS (or not loaded)"
    line = f"NumPy's BLAS: OpenBLAS, idle threads spin 2^{spin} cycles"
    if set_by_tracecomp and spin == SHORT_SPIN:
        return f"{line} (set by tracecomp, imported before NumPy)"
    if TIMEOUT_ENV in os.environ:
        return f"{line} ({TIMEOUT_ENV} set by the user)"
    if spin == DEFAULT_SPIN:
        return (f"{line} (OpenBLAS's default: NumPy was loaded before tracecomp; {TIMEOUT_ENV}={SHORT_SPIN} "
                "or importing tracecomp first shortens it)")
    return line
