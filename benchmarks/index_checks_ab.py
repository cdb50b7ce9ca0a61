"""The cost of the computed-index checks (issue 33), side by side in one process.

Runs W9's argsort and W10's ten item assignments (bench.py's inputs) traced twice, with the
checks (the default) and with tc.trace(..., check_indices=False), calls interleaved so that
a busy machine slows both alike; prints each one's median and best wall time, and the
median CPU time of the process (all its threads: the work done, which waiting for a busy
machine's cores does not inflate), and the ratios.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/index_checks_ab.py --repeat 41
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tracecomp as tc


def w9():
    x = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)
    return (lambda x: tc.argsort(x, -1)), [x]


def w10():
    n, step = 1 << 22, 7
    inputs = [np.random.default_rng(0).standard_normal(n).astype(np.float32),
              np.arange(0, n - 16, step, dtype=np.int64)]

    def assign(x, i):
        y = x * 2
        for k in range(10):
            y[i + k] = float(k)
        return y
    return assign, inputs


def measure(name: str, make, repeat: int) -> None:
    fn, inputs = make()
    variants = {"checked": tc.trace(fn), "unchecked": tc.trace(fn, check_indices=False)}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    results = {k: np.asarray(f(*inputs)) for k, f in variants.items()}        # compile, warm up
    assert np.array_equal(results["checked"], results["unchecked"])
    checks = len(variants["checked"].lower(*inputs).program.computed_checks)
    for _ in range(repeat):
        for k, f in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            f(*inputs)
            wall[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - start_cpu)
    print(f"{name}: {checks} computed checks")
    for what, times in (("wall, median", wall), ("wall, best", wall), ("CPU, median", cpu)):
        pick = min if "best" in what else statistics.median
        t = {k: pick(v) * 1e3 for k, v in times.items()}
        print(f"  {what:13s} checked {t['checked']:8.2f} ms  unchecked {t['unchecked']:8.2f} ms  "
              f"cost {100 * (t['checked'] / t['unchecked'] - 1):+5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--workloads", default="W9,W10")
    args = parser.parse_args()
    for name in args.workloads.split(","):
        measure(name, {"W9": w9, "W10": w10}[name], args.repeat)


if __name__ == "__main__":
    main()
