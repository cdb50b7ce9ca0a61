"""conv2d 32x64x56x56, 64 filters 3x3, padding 1, float32 forward: tc.trace static, with
dynamic n, h, w, and with dynamic=True, interleaved in one process (BENCHMARKS.md, "Sizes
that change: convolution and pooling over a dynamic H and W").  Run it pinned:
    taskset -c 1 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/conv_dynamic.py --rounds 9
Prints the min and median CPU time (time.process_time) of each compile over the rounds."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tracecomp as tc


def conv(x, w):
    return tc.conv2d(x, w, None, 1, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--shape", default="32,64,56,56", help="N,C,H,W of the input")
    args = p.parse_args()
    n, c, h, w = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = (rng.standard_normal((64, c, 3, 3)) / 24).astype(np.float32)
    compiles = {"static": tc.trace(conv), "dynamic n, h, w": tc.trace(conv, dynamic={"x": {0: "n", 2: "h", 3: "w"}}),
                "dynamic=True": tc.trace(conv, dynamic=True)}
    want = np.asarray(compiles["static"](x, weight))
    for name, f in compiles.items():          # compile, and check each against the static one
        np.testing.assert_allclose(np.asarray(f(x, weight)), want, rtol=1e-4, atol=1e-4)
    times = {name: [] for name in compiles}
    for _ in range(args.rounds):
        for name, f in compiles.items():
            t0 = time.process_time()
            f(x, weight)
            times[name].append(time.process_time() - t0)
    for name, ts in times.items():
        print(f"{name:16s} min {min(ts) * 1e3:7.1f} ms  median {statistics.median(ts) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
