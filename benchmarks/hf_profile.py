#!/usr/bin/env python
"""Where one W14 training step (benchmarks/hf_models.py) spends its CPU time under the
tracecomp backend: forward / backward / AdamW, and each compiled kernel of the forward
and backward graphs, with the graph ops it computes.

    taskset -c 1 python benchmarks/hf_profile.py llama [--steps 3] [--top 25] [--impl torch]

CPU time (time.process_time), one thread; meant to run pinned to one core on a shared
machine.  --impl torch / inductor time the same phases for eager or Inductor, with
with --ops torch.profiler's top ops (self CPU) over the timed steps.  Changes nothing in tracecomp:
it wraps each compiled program's kernels (the plan runner is turned off while it profiles).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _wrap(lowered, spent: dict, ops: dict) -> None:
    """Time each kernel of the program `lowered` compiled (once per program)."""
    compiled, program = lowered.compiled, lowered.program
    if getattr(compiled, "_profiled", False):
        return
    compiled._profiled = True
    compiled._run_driver = None
    compiled._prepare_calls()
    if compiled._run_driver is not None:        # a driver program (control flow): time it whole
        run = compiled._run_driver

        def whole(pointers, run=run, name=f"{program.name}:driver"):
            t = time.process_time()
            run(pointers)
            spent[name] += time.process_time() - t
        compiled._run_driver = whole
        return
    names = [f"{program.name}:{k.name}" for k in program.kernels]
    for n, k in zip(names, program.kernels):
        ops[n] = " ".join(dict.fromkeys(o.name for o in program.kernel_ops.get(k.name, [])))

    def timed(name, fn):
        def run(*a):
            t = time.process_time()
            fn(*a)
            spent[name] += time.process_time() - t
        return run
    compiled._calls = [(timed(n, fn), pick) for n, (fn, pick) in zip(names, compiled._calls)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="gpt2, bert, llama, vit, resnet or t5")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--impl", default="tracecomp", choices=("tracecomp", "torch", "inductor"))
    ap.add_argument("--ops", action="store_true", help="torch / inductor: torch.profiler's top ops too")
    ap.add_argument("--show", action="append", default=[], help="print this kernel's loops (program:kernel)")
    args = ap.parse_args(argv)
    import torch
    import tracecomp.runtime.compiled as rc
    import hf_models as hf
    torch.set_num_threads(1)
    rc.DIRECT_POINTERS = 1 << 30            # one ctypes call per kernel, so each can be timed
    spent: dict[str, float] = defaultdict(float)
    ops: dict[str, str] = {}
    lowered = []
    model = hf._model(args.model, training=True)
    opt = torch.optim.AdamW(model.parameters(), lr=hf.LR)
    if args.impl == "tracecomp":
        import tracecomp.torch  # noqa: F401 - registers the backend
        run = torch.compile(model, backend="tracecomp", options={"lowered": lambda r, lw: lowered.append(lw)})
    else:
        run = model if args.impl == "torch" else torch.compile(model, backend="inductor")
    batch = hf._batch(args.model, hf._inputs(args.model))
    phases = defaultdict(float)

    def step(timed: bool):
        t0 = time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = run(**batch).loss
        t1 = time.process_time()
        loss.backward()
        t2 = time.process_time()
        opt.step()
        t3 = time.process_time()
        if timed:
            phases["forward"] += t1 - t0
            phases["backward"] += t2 - t1
            phases["adamw"] += t3 - t2

    t = time.process_time()
    step(False)
    print(f"first step {time.process_time() - t:.2f} s CPU")
    step(False)
    for lw in lowered:
        _wrap(lw, spent, ops)
    spent.clear()
    prof = None
    if args.impl != "tracecomp" and args.ops:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    wall = time.perf_counter()
    for _ in range(args.steps):
        step(True)
    wall = time.perf_counter() - wall
    if prof is not None:
        prof.__exit__(None, None, None)
    n = args.steps
    total = sum(phases.values()) / n
    print(f"{args.model} {args.impl}: step {total * 1e3:.1f} ms CPU = " +
          ", ".join(f"{k} {v / n * 1e3:.1f}" for k, v in phases.items()) + f" ({wall / n * 1e3:.1f} ms wall)")
    if args.impl != "tracecomp":
        if prof is not None:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
        return 0
    from tracecomp.lower.loops.printer import print_kernel
    for lw in lowered:
        for k in lw.program.kernels:
            if f"{lw.program.name}:{k.name}" in args.show:
                print(print_kernel(k))
    kernels = sum(spent.values()) / n
    by_graph = defaultdict(float)
    for k, s in spent.items():
        by_graph[k.split(":")[0]] += s
    print(f"kernels {kernels * 1e3:.1f} ms; per program: " +
          ", ".join(f"{g} {s / n * 1e3:.1f}" for g, s in by_graph.items()))
    for name, s in sorted(spent.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {s / n * 1e3:8.2f} ms {100 * s / n / total:5.1f}%  {name}  {ops.get(name, '')[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
