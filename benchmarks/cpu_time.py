#!/usr/bin/env python
"""CPU time per call of a bench.py case's implementations, interleaved in one process: on a
machine other sessions share, time.process_time of a process pinned to one core
(`taskset -c 1`) moves far less with their load than wall time does.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/cpu_time.py W17-step --impls tracecomp,torch.compile

Each round calls every implementation twice; prints each one's min and median per call.
Run one thread per implementation (torch is set to one; OMP_NUM_THREADS for the others).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", help="a case key of bench.py, e.g. W17-step")
    ap.add_argument("--impls", default="tracecomp,torch,torch.compile")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    case = bench.all_cases()[args.case]
    impls = args.impls.split(",")
    if any(i.startswith("torch") for i in impls):
        import torch
        torch.set_num_threads(1)
    calls = {}
    for impl in impls:
        calls[impl] = case.impls[impl](case.inputs())
        for _ in range(3):              # compiles and warms up
            calls[impl]()
    per_call: dict[str, list[float]] = {i: [] for i in impls}
    for _ in range(args.rounds):
        for impl in impls:
            t = time.process_time()
            calls[impl]()
            calls[impl]()
            per_call[impl].append((time.process_time() - t) / 2)
    for impl in impls:
        times = sorted(per_call[impl])
        print(f"{impl:15s} min {times[0] * 1e3:8.2f} ms  median {times[len(times) // 2] * 1e3:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
