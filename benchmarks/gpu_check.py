#!/usr/bin/env python
"""Issue 39's one prepared check of tracecomp's CUDA path, for a machine with a GPU (and,
with --emulator, for CI without one: the same code at small sizes on the host emulator).

    python benchmarks/gpu_check.py --out DIR            # on the GPU machine (~3-6 minutes)
    python benchmarks/gpu_check.py --emulator --quick   # anywhere: every step, tiny sizes

Steps, each recorded in DIR/gpu_check.json and the table DIR/gpu_check.md:
 1. the device, its driver, PyTorch's view of it;
 2. the CUDA test subset against the real driver (pytest, junit XML parsed): the device
    tests, device tensors and DLPack, loops on the device, the PTX tests, and
    test_gpu_matches_the_cpu_backend, which runs every compiled function of the op-sample
    table on the GPU against the CPU backend;
 3. the floor: the device's copy bandwidth (cuMemcpyDtoD of 1 GiB, bytes read + written);
 4. W1, W2 (softmax, layernorm), W3 (matmul 4096^3 f32), W4 (the MLP train step with
    device-resident weights, donated), W8a (attention's value_and_grad written out) and W8
    (the fused scaled_dot_product_attention, causal, forward + backward) compiled by
    tracecomp for the device, next to PyTorch CUDA eager and torch.compile (Triton) in the
    same process; each result is checked against NumPy in float64 first.  Times are the
    median of 5 batches of back-to-back calls between two synchronizations (the launch
    cost of each call included, as a user's loop pays it).  TF32 is off for PyTorch;
 5. DYN, dynamic sizes (issue 36): an elementwise chain, row softmax over a run-time row
    length, a layernorm MLP forward and a train step over a run-time batch, and causal
    attention over a run-time sequence, each compiled once with `dynamic=` and run at three
    sizes (not multiples of the block sizes) against tracecomp's CPU backend; the compile
    count must be 1, and the largest size is timed against a static compile of its shape.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)          # tracecomp from this checkout, installed or not
TEST_FILES = ["tests/runtime/test_cuda_driver.py", "tests/runtime/test_device_tensors.py",
              "tests/runtime/test_cuda_loops.py", "tests/lower/test_ptx.py", "tests/runtime/test_dlpack_structs.py",
              "tests/lower/test_ptx_dynamic.py"]


# ---------------------------------------------------------------------------- 1. the device

def device_info() -> dict:
    import tracecomp as tc
    from tracecomp.runtime.cuda import driver, memory
    info = {"tracecomp": tc.__version__, "python": platform.python_version(), "host": platform.node(),
            "emulator": memory.emulated()}
    ctx = memory.context()
    info["device"] = ctx.name
    info["compute_capability"] = ".".join(map(str, ctx.compute_capability))
    if not memory.emulated():
        version = driver.ctypes.c_int()
        driver.driver().call("cuDriverGetVersion", driver.ctypes.byref(version))
        info["cuda_driver"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            info["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"unavailable ({e})"
    torch = _torch_cuda()
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_device"] = torch.cuda.get_device_name(0)
    return info


def _torch_cuda():
    """torch, where it is installed with CUDA and sees a GPU (and we are not emulating)."""
    from tracecomp.runtime.cuda import memory
    if memory.emulated():
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# ---------------------------------------------------------------------------- 2. the tests

def run_tests(out_dir: str, workers: int, quick: bool) -> dict:
    xml_path = os.path.join(out_dir, "gpu_tests.xml")
    log_path = os.path.join(out_dir, "gpu_tests.log")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", f"--junitxml={xml_path}",
           *TEST_FILES]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if quick:
        cmd += ["-m", "not slow", "-k", "not emulated_kernels_match"]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    result = {"command": " ".join(cmd[1:]), "exit_code": proc.returncode,
              "seconds": round(time.perf_counter() - t0, 1)}
    result.update(_junit_counts(xml_path))
    return result


def _junit_counts(path: str) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "op_samples_on_device": 0, "failures": []}
    if not os.path.exists(path):
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
            counts["op_samples_on_device"] += "test_gpu_matches_the_cpu_backend[" in name
    return counts


# ---------------------------------------------------------------------------- 3. the floor

def copy_bandwidth(nbytes: int) -> float:
    """GB/s of a device-to-device copy, counting bytes read and written (best of 5)."""
    from tracecomp.runtime.cuda import memory
    ctx = memory.context()
    src, dst = ctx.alloc(nbytes), ctx.alloc(nbytes)
    try:
        ctx.copy(dst, src, nbytes)
        ctx.synchronize()
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(4):
                ctx.copy(dst, src, nbytes)
            ctx.synchronize()
            best = min(best, (time.perf_counter() - t0) / 4)
        return 2 * nbytes / best / 1e9
    finally:
        ctx.free(src)
        ctx.free(dst)


# ---------------------------------------------------------------------------- 4. workloads

def timed(call, sync, reps: int = 5, min_seconds: float = 0.05) -> float:
    """Median seconds per call over `reps` batches, each of enough calls to last min_seconds."""
    call()
    sync()
    n, t0 = 1, time.perf_counter()
    call()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, min(1000, int(min_seconds / one)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        sync()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def rel_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


class Workload:
    """One row: inputs, a float64 reference, tracecomp's device function, torch's function,
    and the floor's operand (bytes moved or flops)."""

    def __init__(self, name, title, inputs, reference, tc_fn, torch_fn, nbytes=0, flops=0, tol=1e-4,
                 runner=None):
        self.name, self.title, self.inputs, self.reference = name, title, inputs, reference
        self.tc_fn, self.torch_fn, self.nbytes, self.flops, self.tol = tc_fn, torch_fn, nbytes, flops, tol
        self.runner = runner          # (tc, arrays) -> (call, result of one call): for W4's state


def _first(out):
    return out[0] if isinstance(out, (list, tuple)) else out


def workloads(quick_sizes: bool) -> list[Workload]:
    import bench
    import tracecomp as tc
    rng = np.random.default_rng(0)
    n1 = 1 << 10 if quick_sizes else 1 << 26
    rows, cols = (64, 64) if quick_sizes else (4096, 4096)
    nm = 64 if quick_sizes else 4096

    def w1(x, m=tc):
        return x * m.sigmoid(1.702 * x) + 0.5 * m.sin(x) * m.exp(-x * x)

    def w1_ref(x):
        x = x.astype(np.float64)
        return x / (1 + np.exp(-1.702 * x)) + 0.5 * np.sin(x) * np.exp(-x * x)

    def ln_ref(x, w, b):
        x = x.astype(np.float64)
        c = x - x.mean(1, keepdims=True)
        return c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5) * w + b

    def sm_ref(x):
        e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    x1 = rng.standard_normal(n1).astype(np.float32)
    xr = rng.standard_normal((rows, cols)).astype(np.float32)
    lw, lb = (rng.standard_normal(cols).astype(np.float32) for _ in range(2))
    a, b = (rng.standard_normal((nm, nm)).astype(np.float32) for _ in range(2))
    out = [
        Workload("W1", f"x*sigmoid(1.702x) + 0.5 sin(x) exp(-x^2), {n1:,} f32", [x1], w1_ref, w1,
                 lambda x: w1(x, _torch_cuda()), nbytes=2 * 4 * n1, tol=1e-5),
        Workload("W2-softmax", f"row softmax {rows}x{cols} f32", [xr], sm_ref, lambda x: tc.softmax(x, -1),
                 lambda x: x.softmax(-1), nbytes=2 * 4 * rows * cols, tol=1e-5),
        Workload("W2-layernorm", f"layernorm {rows}x{cols} f32", [xr, lw, lb], ln_ref,
                 lambda x, w, b: tc.nn.functional.layer_norm(x, (cols,), w, b, 1e-5),
                 lambda x, w, b: _torch_cuda().nn.functional.layer_norm(x, (cols,), w, b, 1e-5),
                 nbytes=2 * 4 * rows * cols, tol=1e-5),
        Workload("W3", f"matmul {nm}^3 f32", [a, b], lambda a, b: a.astype(np.float64) @ b, lambda a, b: a @ b,
                 lambda a, b: a @ b, flops=2 * nm ** 3, tol=1e-5),
    ]
    out.append(_w4(bench, quick_sizes))
    out.append(_w8a(bench, quick_sizes))
    out.append(_w8_attention(quick_sizes))
    return out


def _w8_attention(quick_sizes: bool) -> Workload:
    """The fused op: causal scaled_dot_product_attention forward + backward (W8's attention),
    the gradients of <out, g> in q, k, v."""
    import tracecomp as tc
    shape = (1, 2, 16, 8) if quick_sizes else (8, 6, 256, 64)
    t, d = shape[2], shape[3]
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]

    def reference(q, k, v, g):
        q, k, v, g = (a.astype(np.float64) for a in (q, k, v, g))
        s = np.where(np.tril(np.ones((t, t), bool)), q @ np.swapaxes(k, -1, -2) / np.sqrt(d), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        dp = g @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
        return [ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g]

    def tc_fn(q, k, v, g):
        return list(tc.vjp(lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)[1](g))

    def torch_fn(q, k, v, g):
        torch = _torch_cuda()
        attention = torch.nn.functional.scaled_dot_product_attention
        return list(torch.func.vjp(lambda q, k, v: attention(q, k, v, is_causal=True), q, k, v)[1](g))
    flops = 6 * shape[0] * shape[1] * (t * (t + 1) // 2) * d * 2
    return Workload("W8-attn", f"causal attention fwd + bwd (fused op), {'x'.join(map(str, shape))} f32", arrays,
                    reference, tc_fn, torch_fn, flops=flops, tol=1e-4)


def _w4(bench, quick_sizes: bool) -> Workload:
    """The MLP train step with its weights on the device: each call's outputs are the next
    call's weights (donated), as a training loop runs."""
    import tracecomp as tc
    sizes, batch = ((32, 16, 16, 4), 8) if quick_sizes else (bench.W4_SIZES, bench.W4_BATCH)
    rng = np.random.default_rng(4)
    params = []
    for i, o in zip(sizes[:-1], sizes[1:]):
        params += [(rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32),
                   (0.1 * rng.standard_normal(o)).astype(np.float32)]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)

    def loss_fn(w1, b1, w2, b2, w3, b3, x, y, m):
        h = m.relu(x @ w1 + b1)
        h = m.relu(h @ w2 + b2)
        return m.nn.functional.cross_entropy(h @ w3 + b3, y)

    vg = tc.value_and_grad(lambda *a: loss_fn(*a, tc), argnums=(0, 1, 2, 3, 4, 5))

    def tc_step(*args):
        loss, grads = vg(*args)
        return [loss] + [p - bench.LR * g for p, g in zip(args[:6], grads)]

    def tc_runner(arrays):
        step = tc.trace(tc_step, device="cuda", donate_argnums=(0, 1, 2, 3, 4, 5))
        state = {"p": [tc.tensor(p, device="cuda") for p in arrays[:6]]}
        xd, yd = tc.tensor(arrays[6], device="cuda"), tc.tensor(arrays[7], device="cuda")
        first = [t.cpu().numpy() for t in tc.trace(tc_step, device="cuda")(*state["p"], xd, yd)]

        def call():
            out = step(*state["p"], xd, yd)
            state["p"] = out[1:]
        return call, first

    def torch_step(*args):
        torch = _torch_cuda()
        ps = [p.detach().requires_grad_() for p in args[:6]]
        loss = loss_fn(*ps, *args[6:], torch)
        grads = torch.autograd.grad(loss, ps)
        with torch.no_grad():
            return [loss.detach()] + [p - bench.LR * g for p, g in zip(ps, grads)]

    def reference(*arrays):
        return bench.w4_numpy([a.astype(np.float64) for a in arrays[:6]], arrays[6].astype(np.float64),
                              arrays[7], bench.LR)
    flops = 6 * batch * sum(i * o for i, o in zip(sizes[:-1], sizes[1:]))
    return Workload("W4", f"MLP train step {batch}x{'-'.join(map(str, sizes))} f32, weights on the device",
                    params + [x, y], reference, tc_step, torch_step, flops=flops, tol=1e-3, runner=tc_runner)


def _w8a(bench, quick_sizes: bool) -> Workload:
    import tracecomp as tc
    shape = (2, 16, 8) if quick_sizes else bench.W8A_SHAPE
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]

    def tc_fn(q, k, v, g):
        value, grads = tc.value_and_grad(bench.w8a_loss(lambda s: tc.softmax(s, -1)), argnums=(0, 1, 2))(q, k, v, g)
        return [value, *grads]

    def torch_fn(q, k, v, g):
        torch = _torch_cuda()
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        value = bench.w8a_loss(lambda s: s.softmax(-1))(q, k, v, g)
        return [value.detach(), *torch.autograd.grad(value, (q, k, v))]

    bh, t, d = shape
    return Workload("W8a", f"attention value_and_grad, B*H={bh}, T={t}, d={d} f32", arrays,
                    lambda *a: bench.w8a_numpy(*[x.astype(np.float64) for x in a]), tc_fn, torch_fn,
                    flops=2 * bh * t * t * d * 6, tol=1e-4)


def _errors(outs, refs) -> float:
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    refs = refs if isinstance(refs, (list, tuple)) else [refs]
    return max(rel_error(o, r) for o, r in zip(outs, refs))


def measure(w: Workload, floors: dict) -> dict:
    import tracecomp as tc
    row = {"name": w.name, "title": w.title}
    ref = w.reference(*w.inputs)
    sync = tc.cuda.synchronize
    try:
        if w.runner is not None:
            call, first = w.runner(w.inputs)
        else:
            f = tc.trace(w.tc_fn, device="cuda")
            args = [tc.tensor(a, device="cuda") for a in w.inputs]
            first = f(*args)
            first = [t.cpu().numpy() for t in (first if isinstance(first, (list, tuple)) else [first])]

            def call():
                f(*args)
        row["tracecomp_error"] = _errors(first, ref)
        row["tracecomp_ok"] = row["tracecomp_error"] <= w.tol
        row["tracecomp_s"] = timed(call, sync)
    except Exception as e:           # noqa: BLE001 - a failure is a row of the report
        row["tracecomp_failure"] = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.print_exc()
    torch = _torch_cuda()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        targs = [torch.from_numpy(a).cuda() for a in w.inputs]
        for label, fn in (("torch", w.torch_fn), ("torch.compile", None)):
            try:
                fn = fn if fn is not None else torch.compile(w.torch_fn)
                out = fn(*targs)
                out = [o.detach().cpu().numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
                row[f"{label}_error"] = _errors(out, ref)
                row[f"{label}_s"] = timed(lambda: fn(*targs), torch.cuda.synchronize)
            except Exception as e:   # noqa: BLE001
                row[f"{label}_failure"] = f"{type(e).__name__}: {str(e)[:400]}"
    if w.nbytes and floors.get("copy_GBps"):
        row["floor_s"] = w.nbytes / (floors["copy_GBps"] * 1e9)
    if "tracecomp_s" in row:
        row["tracecomp_rate"] = (f"{w.nbytes / row['tracecomp_s'] / 1e9:.0f} GB/s" if w.nbytes else
                                 f"{w.flops / row['tracecomp_s'] / 1e12:.2f} TFLOP/s")
    return row


# ---------------------------------------------------------------------------- 5. dynamic sizes

def dynamic_cases(quick_sizes: bool) -> list[tuple]:
    """(name, fn, make(n) -> arrays, dynamic spec, three sizes, tolerance) per case."""
    import tracecomp as tc
    F = tc.nn.functional
    rng = np.random.default_rng(36)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def weight(i, o):
        return (rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)
    small = quick_sizes
    d, hidden = (8, 16) if small else (256, 1024)
    mlp_w = [f32(d), f32(d), weight(d, hidden), f32(hidden), weight(hidden, d)]
    step_w = [weight(d, hidden), f32(hidden), weight(hidden, 10), f32(10)]

    def mlp(x, ln_w, ln_b, w1, b1, w2):
        return F.gelu(F.layer_norm(x, (d,), ln_w, ln_b) @ w1 + b1) @ w2

    def loss(w1, b1, w2, b2, x, y):
        return F.cross_entropy(tc.relu(x @ w1 + b1) @ w2 + b2, y)
    grad = tc.grad(loss, argnums=(0, 1, 2, 3))

    def step(w1, b1, w2, b2, x, y):
        return tuple(p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grad(w1, b1, w2, b2, x, y)))

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    heads, hd = (1, 8) if small else (8, 64)
    return [
        ("chain", lambda x: ((x * 2 + 1).exp() * 0.5).tanh() + x.sin(), lambda n: [f32(n)], {"x": {0: "n"}},
         (3, 70, 300) if small else (1 << 20, (1 << 22) + 3, 3_000_001), 1e-5),
        ("softmax rows", lambda x: x.softmax(dim=-1), lambda n: [f32(4 if small else 1024, n)], {"x": {1: "n"}},
         (2, 9, 33) if small else (1000, 4096, 4099), 1e-5),
        ("layernorm MLP", mlp, lambda n: [f32(n, d)] + mlp_w, {"x": {0: "batch"}},
         (2, 5, 9) if small else (256, 1000, 4097), 1e-4),
        ("train step", step, lambda n: step_w + [f32(n, d), rng.integers(0, 10, n)],
         {"x": {0: "batch"}, "y": {0: "batch"}}, (2, 5, 9) if small else (64, 256, 1000), 1e-4),
        ("causal attention", attention, lambda n: [f32(heads, n, hd) for _ in range(3)],
         {"q": {1: "seq"}, "k": {1: "seq"}, "v": {1: "seq"}}, (3, 9, 17) if small else (100, 256, 513), 1e-4),
    ]


def check_dynamic(quick_sizes: bool, timing: bool) -> list[dict]:
    """Each dynamic case compiled once for the device, run at its three sizes against the CPU
    backend; with `timing`, the largest size also against a static compile (same device)."""
    import tracecomp as tc
    rows = []
    for name, fn, make, dynamic, sizes, tol in dynamic_cases(quick_sizes):
        row = {"name": name, "sizes": list(sizes), "dynamic": json.dumps(dynamic)}
        try:
            f, cpu = tc.trace(fn, device="cuda", dynamic=dynamic), tc.trace(fn)
            errors = []
            for n in sizes:
                args = make(n)
                got, want = f(*args), cpu(*args)
                got = [t.cpu().numpy() for t in (got if isinstance(got, (list, tuple)) else [got])]
                errors.append(_errors(got, [np.asarray(w) for w in (want if isinstance(want, (list, tuple)) else [want])]))
            row["compiles"] = len(f.signatures)
            row["error"] = max(errors)
            row["ok"] = row["error"] <= tol and row["compiles"] == 1
            if timing:
                args = [tc.tensor(a, device="cuda") for a in make(sizes[-1])]
                static = tc.trace(fn, device="cuda")
                row["dynamic_s"] = timed(lambda: f(*args), tc.cuda.synchronize)
                row["static_s"] = timed(lambda: static(*args), tc.cuda.synchronize)
        except Exception as e:           # noqa: BLE001 - a failure is a row of the report
            row["ok"], row["failure"] = False, f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------------------- the report

def markdown(report: dict) -> str:
    info, tests = report["device"], report.get("tests", {})
    lines = [f"# gpu_check: {info.get('device')} (compute capability {info.get('compute_capability')})", "",
             f"- driver: {info.get('nvidia_smi', info.get('cuda_driver', '-'))}; CUDA driver API "
             f"{info.get('cuda_driver', '-')}; torch {info.get('torch', '-')}; tracecomp {info['tracecomp']}; "
             f"emulator: {info['emulator']}",
             f"- copy bandwidth (device to device, read + write): {report.get('copy_GBps', 0):.0f} GB/s"]
    if tests:
        lines.append(f"- tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped "
                     f"in {tests['seconds']} s; op samples compared on the device: {tests['op_samples_on_device']}")
        lines += [f"  - FAILED {name}" for name in tests["failures"][:40]]
    lines += ["", "| workload | tracecomp | rate | torch eager | torch.compile | eager / tc | compile / tc | "
              "floor / tc | tc error |", "|---|---|---|---|---|---|---|---|---|"]

    def ms(row, key):
        if f"{key}_failure" in row:
            return "FAILED"
        return f"{row[key + '_s'] * 1e3:.3f} ms" if key + "_s" in row else "-"

    def ratio(row, key):
        if key + "_s" in row and "tracecomp_s" in row:
            return f"{row[key + '_s'] / row['tracecomp_s']:.2f}"
        return "-"
    for row in report["workloads"]:
        err = f"{row['tracecomp_error']:.1e}" + ("" if row.get("tracecomp_ok") else " WRONG") \
            if "tracecomp_error" in row else row.get("tracecomp_failure", "-")[:80]
        lines.append(f"| {row['name']}: {row['title']} | {ms(row, 'tracecomp')} | {row.get('tracecomp_rate', '-')} | "
                     f"{ms(row, 'torch')} | {ms(row, 'torch.compile')} | {ratio(row, 'torch')} | "
                     f"{ratio(row, 'torch.compile')} | {ratio(row, 'floor')} | {err} |")
    if report.get("dynamic"):
        lines += ["", "Dynamic sizes: one compile, three sizes, against the CPU backend; the largest size "
                  "timed against a static compile", "",
                  "| case | sizes | compiles | max rel. error | dynamic | static | static / dynamic |",
                  "|---|---|---|---|---|---|---|"]
        for row in report["dynamic"]:
            timing = ("-", "-", "-") if "dynamic_s" not in row else (
                f"{row['dynamic_s'] * 1e3:.3f} ms", f"{row['static_s'] * 1e3:.3f} ms",
                f"{row['static_s'] / row['dynamic_s']:.2f}")
            err = f"{row['error']:.1e}" + ("" if row["ok"] else " WRONG") if "error" in row else \
                "FAILED " + row.get("failure", "")[:80]
            lines.append(f"| {row['name']} | {row['sizes']} | {row.get('compiles', '-')} | {err} | "
                         + " | ".join(timing) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="folder for gpu_check.json/.md and the test log (default: a temp folder)")
    p.add_argument("--emulator", action="store_true", help="run on the host emulator (no GPU needed)")
    p.add_argument("--quick", action="store_true", help="small sizes and the fast tests only")
    p.add_argument("--no-tests", action="store_true", help="skip the pytest subset")
    p.add_argument("--workloads", default="W1,W2,W3,W4,W8a,W8,DYN",
                   help="comma-separated: W1,W2,W3,W4,W8a,W8 (fused attention), DYN (dynamic sizes)")
    p.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="pytest-xdist workers")
    args = p.parse_args(argv)
    if args.emulator:
        os.environ["TRACECOMP_CUDA_EMULATOR"] = "1"
    out_dir = args.out or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(out_dir, exist_ok=True)
    report: dict = {"device": device_info(), "workloads": []}
    print(json.dumps(report["device"]), flush=True)
    if not args.no_tests:
        report["tests"] = run_tests(out_dir, args.workers, args.quick)
        print("tests:", {k: v for k, v in report["tests"].items() if k != "failures"}, flush=True)
    report["copy_GBps"] = copy_bandwidth(1 << 20 if args.emulator else 1 << 30)
    wanted = set(args.workloads.split(","))
    for w in workloads(quick_sizes=args.quick or args.emulator):
        if w.name.split("-")[0] in wanted:
            row = measure(w, report)
            report["workloads"].append(row)
            print(json.dumps(row), flush=True)
    if "DYN" in wanted:
        report["dynamic"] = check_dynamic(args.quick or args.emulator, timing=not args.emulator)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(out_dir, "gpu_check.md"), "w") as f:
        f.write(text)
    print(text)
    bad = [r["name"] for r in report["workloads"] if not r.get("tracecomp_ok")] + \
        [r["name"] for r in report.get("dynamic", []) if not r["ok"]]
    failed = report.get("tests", {}).get("failed", 0) or report.get("tests", {}).get("exit_code", 0) not in (0, None)
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
