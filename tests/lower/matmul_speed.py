"""Matmul speed next to NumPy's, in one run: `python tests/lower/matmul_speed.py [size:dtype ...]`.

Prints GFLOP/s for tracecomp's compiled `x @ y` (its normal call path: input checks,
a fresh output) and for `np.matmul` on the same NumPy arrays, default cases 1024^3 and
4096^3 f32 and 512^3 f64: the best and the median of calls made in blocks that alternate
between the two, so that both see the same machine (on a shared or virtual host the
cores' speed changes from second to second).  OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed from
the environment before NumPy loads, so OpenBLAS uses the kernels it picks for this CPU.
`aligned` adds a column with 64-byte aligned inputs.  With OMP_NUM_THREADS=1 (and
OPENBLAS_NUM_THREADS=1) every call runs on the calling thread, so the script also prints
medians of the thread's CPU time, which other processes on a loaded machine barely move
(wall-clock medians there measure the load as much as the code).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_var, None)

import numpy as np  # noqa: E402

import tracecomp as tc  # noqa: E402
from tracecomp.runtime.memory import aligned_empty  # noqa: E402


def alternate(calls: dict, rounds: int, block: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each function (by `clock`): `rounds` rounds of `block` calls of
    each in turn, with a pause before each block (OpenBLAS's workers spin for ~0.1 s after
    a call, and libgomp's briefly, which would slow down whichever side runs next)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            time.sleep(0.3)
            for _ in range(block):
                start = clock()
                fn()
                times[name].append(clock() - start)
    return times


def measure(n: int, dtype, rounds: int, block: int, clock=time.perf_counter) -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    f = tc.trace(lambda x, y: x @ y)
    got = np.asarray(f(a, b))               # compile, and check once
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - want).max() <= 4 * n * np.finfo(dtype).eps * np.abs(want).max()
    a64, b64 = aligned_empty(a.shape, a.dtype), aligned_empty(b.shape, b.dtype)
    a64[...], b64[...] = a, b
    return alternate({"tracecomp": lambda: f(a, b), "aligned": lambda: f(a64, b64),
                      "numpy": lambda: np.matmul(a, b)}, rounds, block, clock)


def main(cases: list[str]) -> None:
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'all')}, cores {os.cpu_count()}; "
          "GFLOP/s best (median)")
    one_thread = os.environ.get("OMP_NUM_THREADS") == "1" and os.environ.get("OPENBLAS_NUM_THREADS") == "1"
    clocks = {"wall": time.perf_counter, "cpu": time.thread_time} if one_thread else {"wall": time.perf_counter}
    for case in cases:
        size, dtype = case.split(":")
        n = int(size)
        for clock_name, clock in clocks.items():
            times = measure(n, np.dtype(dtype).type, 4 if n >= 4096 else 8, 2 if n >= 4096 else 12, clock)
            rate = {name: (2.0 * n ** 3 / min(t) / 1e9, 2.0 * n ** 3 / statistics.median(t) / 1e9)
                    for name, t in times.items()}
            cols = "   ".join(f"{name} {best:6.1f} ({median:6.1f})" for name, (best, median) in rate.items())
            print(f"{n}^3 {dtype} {clock_name}: {cols}   best ratio {rate['tracecomp'][0] / rate['numpy'][0]:4.2f}"
                  f"   median ratio {rate['tracecomp'][1] / rate['numpy'][1]:4.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["1024:float32", "512:float64", "4096:float32"])
