"""The cost of the computed-index checks (issue 33), side by side in one process.

Runs W9's argsort and W10's ten item assignments (bench.py's inputs) traced twice, with the
checks (the default) and with tc.trace(..., check_indices=False), calls interleaved so that
a busy machine slows both alike; prints each one's median and best time and the ratio.

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
    times: dict[str, list[float]] = {k: [] for k in variants}
    results = {k: np.asarray(f(*inputs)) for k, f in variants.items()}        # compile, warm up
    assert np.array_equal(results["checked"], results["unchecked"])
    checks = len(variants["checked"].lower(*inputs).program.computed_checks)
    for _ in range(repeat):
        for k, f in variants.items():
            start = time.perf_counter()
            f(*inputs)
            times[k].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    best = {k: min(v) * 1e3 for k, v in times.items()}
    print(f"{name}: {checks} computed checks; checked {med['checked']:.2f} ms (best {best['checked']:.2f}), "
          f"unchecked {med['unchecked']:.2f} ms (best {best['unchecked']:.2f}); "
          f"cost {100 * (med['checked'] / med['unchecked'] - 1):+.1f}% median, "
          f"{100 * (best['checked'] / best['unchecked'] - 1):+.1f}% best")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--workloads", default="W9,W10")
    args = parser.parse_args()
    for name in args.workloads.split(","):
        measure(name, {"W9": w9, "W10": w10}[name], args.repeat)


if __name__ == "__main__":
    main()
