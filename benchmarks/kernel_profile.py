#!/usr/bin/env python
"""Where a compiled tracecomp call spends its time: each kernel's wall time (and the random
fills'), over repeated calls of one of bench.py's cases, with the graph ops it computes.

    python benchmarks/kernel_profile.py W8-step [--calls 5] [--top 15]

Kernels run one after another (each may use every core inside), so timing each native
call from Python adds up to the call's time, less the argument marshalling.  The compile
stages of the first call (Lowered.timings) are printed first.  Wraps the CompiledProgram's
prepared calls; changes nothing in tracecomp.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", help="a case key of bench.py, e.g. W7-step, W7-conv, W8-fwd")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with time.process_time (this process's CPU time: for a shared machine, pinned with taskset)")
    args = ap.parse_args(argv)
    clock = time.process_time if args.cpu_time else time.perf_counter
    import tracecomp.runtime.compiled as compiled_module
    # one native call per kernel, so each can be timed: not the driver that runs them all in one call
    compiled_module.DIRECT_POINTERS = compiled_module.MAX_ARITY = 1 << 30
    case = bench.all_cases()[args.case]
    call = case.impls["tracecomp"](case.inputs())
    t0 = time.perf_counter()
    call()
    print(f"first call {time.perf_counter() - t0:.2f} s")
    f, fargs = getattr(call, "traced", None), getattr(call, "args", None)
    if f is None:                   # a standard() case: rebuild its traced function
        import tracecomp as tc
        fargs = [bench.aligned(a) for a in case.inputs()]
        f = tc.trace(case.impls["tracecomp"].__closure__[0].cell_contents)
        f(*fargs)
    lowered = f.lower(*fargs)
    print("compile stages: " + ", ".join(f"{k} {v:.3f} s" for k, v in lowered.timings.items()))
    compiled, program = lowered.compiled, lowered.program
    spent: dict[str, float] = defaultdict(float)
    names = [k.name for k in program.kernels]

    def timed(name, fn):
        def run(*a):
            t = clock()
            fn(*a)
            spent[name] += clock() - t
        return run
    compiled._calls = [(timed(n, fn), pick) for n, (fn, pick) in zip(names, compiled._calls)]
    t0 = clock()
    for _ in range(args.calls):
        f(*fargs)
    total = (clock() - t0) / args.calls
    kernels = sum(spent.values()) / args.calls
    print(f"{len(names)} kernels; per call {total * 1e3:.2f} ms, of which kernels {kernels * 1e3:.2f} ms "
          f"(the rest: random fills, outputs, marshalling)")
    ops = getattr(program, "kernel_ops", {}) or {}
    for name, s in sorted(spent.items(), key=lambda kv: -kv[1])[:args.top]:
        what = ops.get(name)
        what = " ".join(dict.fromkeys(o.name for o in what)) if what else ""
        print(f"  {s / args.calls * 1e3:8.2f} ms {100 * s / args.calls / total:5.1f}%  {name}  {what[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
