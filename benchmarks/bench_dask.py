#!/usr/bin/env python
"""tracecomp on Dask (issue 16): train steps per second in one process and data-parallel
on the workers of a LocalCluster, and the time of one gradient all-reduce per MB.

    python benchmarks/bench_dask.py                  # W4 and W8, 2 workers (~2 minutes)
    python benchmarks/bench_dask.py --workers 2 --steps 30 --json out.json
    python benchmarks/bench_dask.py --workloads W4 --big 10    # and a 10 GiB .npy file, reduced

Method:
- "one process": the train step (value_and_grad of the loss, then the tc.optim update),
  one tc.trace'd function with params and state donated, on the whole global batch, with
  all the cores (tracecomp's own threads), in a child process of its own;
- "DataParallel": tracecomp.dask.DataParallel over N workers of a LocalCluster (one
  thread each, so N workers use N cores), the same global batch split by rows, the batch
  sent from the client each step (as a user's loop does);
- both are timed over `--steps` steps after a warm-up of 3 (compiles); steps per second =
  steps / wall time, the client waiting for the last loss;
- the all-reduce: what DataParallel does with a gradient vector of S MB per worker: a tree
  of pairwise sums between workers (Dask moves the vectors worker to worker) and the sum
  delivered to every worker; the median of 15 over S = 1, 4, 16, 64 MB.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def w4_problem():
    import bench
    import tracecomp as tc
    params, x, y = bench.w4_data()
    lr = bench.LR

    def loss_fn(params, x, y):
        w1, b1, w2, b2, w3, b3 = params
        h = tc.relu(x @ w1 + b1)
        h = tc.relu(h @ w2 + b2)
        return tc.cross_entropy(h @ w3 + b3, y)
    return loss_fn, params, (x, y), tc.optim.SGD(lr=lr)


def w8_problem():
    import bench
    import tracecomp as tc
    import tracecomp.nn.functional as F
    data = bench.w8_data()
    n = len(bench.w8_shapes())
    w8_loss = bench.w8_loss           # the function travels to the workers, not the module

    def loss_fn(params, x, y):
        return w8_loss(F, params, x, y)
    return loss_fn, data[:n], (data[-2], data[-1]), tc.optim.AdamW(lr=1e-3)


PROBLEMS = {"W4": w4_problem, "W8": w8_problem}


def one_process(name: str, steps: int) -> dict:
    """Steps per second of the whole batch in this process (run in a child: see main)."""
    import tracecomp as tc
    loss_fn, params, batch, opt = PROBLEMS[name]()

    def step(params, state, *batch):
        loss, grads = tc.value_and_grad(loss_fn)(params, *batch)
        params, state = opt.update(grads, state, params)
        return params, state, loss
    traced = tc.trace(step, donate_argnums=(0, 1))
    params, state = [tc.tensor(p) for p in params], opt.init([tc.tensor(p) for p in params])
    for _ in range(3):
        params, state, loss = traced(params, state, *batch)
    t0 = time.perf_counter()
    for _ in range(steps):
        params, state, loss = traced(params, state, *batch)
    float(loss)
    seconds = time.perf_counter() - t0
    return {"steps_per_s": steps / seconds, "ms_per_step": 1e3 * seconds / steps}


def data_parallel(client, name: str, steps: int) -> dict:
    import bench
    import cloudpickle
    import tracecomp.dask as tcd
    cloudpickle.register_pickle_by_value(bench)      # the workers cannot import this folder's modules
    loss_fn, params, batch, opt = PROBLEMS[name]()
    dp = tcd.DataParallel(loss_fn, params, opt, client, checkpoint_every=10 ** 9)
    for _ in range(3):
        dp.step(*batch)
    dp.losses([dp.steps])
    t0 = time.perf_counter()
    for _ in range(steps):
        dp.step(*batch)
    dp.losses([dp.steps])
    seconds = time.perf_counter() - t0
    gradient_bytes = sum(np.asarray(p).nbytes for p in params)
    dp.close()
    return {"steps_per_s": steps / seconds, "ms_per_step": 1e3 * seconds / steps,
            "gradient_mb": gradient_bytes / 1e6}


def _filled(nbytes: int, value: float) -> np.ndarray:
    return np.full(nbytes // 4, value, np.float32)


def _pair_sum(a, b):
    return a + b


def _delivered(total) -> float:
    return float(total[0])


def all_reduce(client, sizes_mb=(1, 4, 16, 64), repeat: int = 15) -> list[dict]:
    """A tree of pairwise sums over one vector per worker, the total delivered to each."""
    workers = sorted(client.scheduler_info()["workers"])
    rows = []
    for mb in sizes_mb:
        times = []
        for r in range(repeat):
            parts = [client.submit(_filled, mb << 20, float(k), workers=[w], pure=False) for k, w in enumerate(workers)]
            client.gather(parts)
            t0 = time.perf_counter()
            level = parts
            while len(level) > 1:
                level = [client.submit(_pair_sum, *level[i:i + 2], pure=False) if i + 1 < len(level) else level[i]
                         for i in range(0, len(level), 2)]
            client.gather([client.submit(_delivered, level[0], workers=[w], allow_other_workers=False, pure=False)
                           for w in workers])
            times.append(time.perf_counter() - t0)
            del parts, level
        median = statistics.median(times)
        rows.append({"mb": mb, "ms": 1e3 * median, "ms_per_mb": 1e3 * median / mb,
                     "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times)})
    return rows


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def big_file(client, gigabytes: float, folder: str) -> dict:
    """A reduction over an .npy file of `gigabytes` on disk, read in 64 MiB chunks on the
    workers: the time, the rate and the workers' peak memory (which must stay far below
    the file's size)."""
    import tracecomp as tc
    import tracecomp.dask as tcd
    cols = 256
    rows = int(gigabytes * 2 ** 30) // (4 * cols)
    path = os.path.join(folder, "tracecomp-bench-big.npy")
    mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    step = 1 << 18
    for start in range(0, rows, step):
        mapped[start:start + step] = np.random.default_rng(start).standard_normal((min(step, rows - start), cols))
    mapped.flush()
    del mapped
    try:
        before = max(client.run(_peak_rss_mb).values())
        t0 = time.perf_counter()
        x = tcd.from_npy(path, rows=1 << 16)                   # 64 MiB chunks
        tcd.reduce_rows(lambda b: tc.tanh(b) * b, x, how="mean").compute()
        seconds = time.perf_counter() - t0
        peak = max(client.run(_peak_rss_mb).values())
    finally:
        os.unlink(path)
    size = rows * cols * 4
    return {"gb": size / 2 ** 30, "seconds": seconds, "gb_per_s": size / 2 ** 30 / seconds,
            "worker_peak_rss_mb": peak, "worker_peak_rss_mb_before": before}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--workloads", default="W4,W8")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--big", type=float, default=0, metavar="GB",
                   help="also reduce an .npy file of GB gibibytes written to --big-folder (default: skip)")
    p.add_argument("--big-folder", default="/tmp")
    p.add_argument("--one-process", help=argparse.SUPPRESS)      # the child's job
    args = p.parse_args(argv)
    if args.one_process:
        print(json.dumps(one_process(args.one_process, args.steps)))
        return 0
    from distributed import Client, LocalCluster
    import llvmlite.binding as llvm
    names = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    result = {"cpu": platform.processor() or llvm.get_host_cpu_name(), "llvm_cpu": llvm.get_host_cpu_name(),
              "cores": os.cpu_count(), "workers": args.workers, "steps": args.steps, "workloads": {}}
    for name in names:                    # one process first, alone on the machine
        out = subprocess.run([sys.executable, __file__, "--one-process", name, "--steps", str(args.steps)],
                             capture_output=True, text=True, check=True)
        result["workloads"][name] = {"one_process": json.loads(out.stdout.strip().splitlines()[-1])}
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0", silence_logs=logging.ERROR)
    client = Client(cluster)
    try:
        for name in names:
            result["workloads"][name]["data_parallel"] = data_parallel(client, name, args.steps)
        result["all_reduce"] = all_reduce(client)
        if args.big:
            result["big_file"] = big_file(client, args.big, args.big_folder)
    finally:
        client.close()
        cluster.close()
    print(f"{result['llvm_cpu']}, {result['cores']} cores; DataParallel on {args.workers} workers of a LocalCluster")
    print(f"{'workload':8} {'one process':>14} {'DataParallel':>14} {'ratio':>6} {'gradient':>9}")
    for name, r in result["workloads"].items():
        a, b = r["one_process"], r["data_parallel"]
        print(f"{name:8} {a['steps_per_s']:9.1f} st/s {b['steps_per_s']:9.1f} st/s "
              f"{b['steps_per_s'] / a['steps_per_s']:6.2f} {b['gradient_mb']:6.1f} MB")
    print("all-reduce (tree sum + delivery to every worker):")
    for r in result["all_reduce"]:
        print(f"  {r['mb']:3d} MB: {r['ms']:8.2f} ms  ({r['ms_per_mb']:.2f} ms/MB; {r['min_ms']:.2f}-{r['max_ms']:.2f})")
    if "big_file" in result:
        r = result["big_file"]
        print(f"reduce_rows over a {r['gb']:.1f} GiB .npy file: {r['seconds']:.1f} s ({r['gb_per_s']:.2f} GiB/s); "
              f"workers' peak memory {r['worker_peak_rss_mb']:.0f} MB (before: {r['worker_peak_rss_mb_before']:.0f} MB)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
