"""Matmul speed next to NumPy's, in one run: `python tests/matmul_speed.py [size:dtype ...]`.

Prints GFLOP/s (best of several calls, inputs and outputs preallocated by each side's
normal call path) for tracecomp's compiled `x @ y` and for `np.matmul`, default cases
1024^3 and 4096^3 f32 and 512^3 f64.  OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed
from the environment before NumPy loads, so OpenBLAS uses the kernels it picks for this
CPU.  Timing noise from other processes on the machine shows up as a spread between
repeated runs; compare the two columns of one line, not lines of different runs.
"""
from __future__ import annotations

import os
import sys
import time

for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_var, None)

import numpy as np  # noqa: E402

import tracecomp as tc  # noqa: E402


def best_seconds(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(n: int, dtype, reps: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    f = tc.trace(lambda x, y: x @ y)
    got = np.asarray(f(a, b))               # compile, and check once
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - want).max() <= 4 * n * np.finfo(dtype).eps * np.abs(want).max()
    flop = 2.0 * n ** 3
    ours = best_seconds(lambda: f(a, b), reps)
    theirs = best_seconds(lambda: np.matmul(a, b), reps)
    return flop / ours / 1e9, flop / theirs / 1e9


def main(cases: list[str]) -> None:
    print(f"threads: tracecomp OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'all')}, cores {os.cpu_count()}")
    for case in cases:
        size, dtype = case.split(":")
        n = int(size)
        reps = 3 if n >= 4096 else 10
        ours, theirs = measure(n, np.dtype(dtype).type, reps)
        print(f"{n}^3 {dtype}: tracecomp {ours:7.1f} GFLOP/s   numpy {theirs:7.1f} GFLOP/s   "
              f"ratio {ours / theirs:5.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["1024:float32", "512:float64", "4096:float32"])
