#!/usr/bin/env python
"""tracecomp's benchmark: the workloads W1-W8 of DESIGN.md ("Performance method") and W9-W13,
measured side by side in one run against NumPy and, when installed, PyTorch eager,
torch.compile and jax.jit, with the physical floor of each kernel.

    python benchmarks/bench.py                       # everything (~5 minutes on 2 cores, and ~20 for W12-W13)
    python benchmarks/bench.py --workloads W1,W3 --repeat 9 --json out.json
    python benchmarks/bench.py --quick               # 3 repeats, no 4096 matmul, W5 without peers
    python benchmarks/bench.py --threads 1           # every implementation on one thread
    python benchmarks/bench.py --workloads W12,W12c,W13     # the loops (issue 35)

Run it with OpenBLAS's core-type override unset, or NumPy's BLAS runs a slower kernel:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench.py

Method:
- the parent process measures the machine (copy bandwidth, fp32 peak), makes each case's
  inputs and its NumPy float64 reference once, and runs every implementation of the case
  in a fresh child process of its own (so that one runtime's idle worker threads, which
  spin for a while after each parallel region, never take the cores from the next; on
  the loaded 2-core machine NumPy's W4 step took 196-252 ms per call in a process where
  torch had run, 56 ms in a process of its own); `--in-process` runs them
  all in this process instead, their repetitions interleaved;
- an implementation's first call is its warm-up (and its compile); its result is checked
  against the float64 reference before any timing, and a result outside the tolerance is
  reported as WRONG and not timed;
- then `--repeat` timed repetitions; a repetition of a fast call loops it long enough to
  last >= 50 ms, and a slow implementation gets fewer repetitions (at least 3) past
  ROW_BUDGET_S; the tables give the median and the spread (min - max);
- the floor: memory-bound kernels, the minimum bytes moved (inputs read once, outputs
  written once) / the best measured copy bandwidth (bytes read + written per second);
  matmul-bound kernels, the FLOPs / the fp32 peak, measured with a JIT-compiled FMA loop;
  "% of floor" = floor time / median time;
- other processes on the machine are measured too (their share of the cores, from
  /proc/stat) and printed per workload: the medians are only as good as that allows.
W5 (first call of W4) runs in fresh processes by definition, cold and, for the peers that
have a persistent compile cache, warm.  A cold tracecomp cache folder holds only the CPU's
tuning record (runtime/tuning.py: measured once per CPU, its time printed once per run).
W8a is attention's value_and_grad (issue 15); W1 and W3 at 1024^3 also run "after NumPy":
a NumPy matmul, untimed, right before every timed call in the same process.
W7 (a CNN train step, its forward alone, and its second conv alone) and W8 (a GPT-style
block's AdamW train step and its forward alone; and the step's first call, cold, in fresh
processes with empty compile caches) have no NumPy implementation but the conv, and their
reference is PyTorch eager in float64 with autograd (not run without torch).  W7's
dropout (p = 0.25) makes its result random: each implementation's p = 0 variant, the same
program otherwise, is what is checked against the reference (`Case.check_impls`), and the
timed p = 0.25 one only for its shapes and finite values; jax draws its mask from a key
passed as an argument (the same key every call, but drawn at run time).  Their floors
are FLOPs / peak (the formulas: w7_flops, w8_flops).
W12 (issue 35) is a one-layer LSTM's Adam train step (batch 32, 64 -> 256, a 256 -> 10 head
and cross-entropy on the last step's hidden state) at T = 100 and 1,000: tracecomp as one
tc.scan of a hand-written cell, and as "tracecomp-unrolled" (the Python loop traced into
the graph; T = 100 only, run when tracecomp is), torch.nn.LSTM eager (oneDNN), torch.compile
of the hand-written Python loop (its child gets W12_TORCH_COMPILE_LIMIT_S, then its row says
"timed out" and how far it got) and jax.lax.scan under jax.jit; the reference is the step
in NumPy float64 with its backward through time by hand (w12_numpy_step); the floor FLOPs /
peak (w12_flops).  W12c is that step's first call in fresh processes with empty compile
caches at T = 10 to 10,000 (tracecomp's scan; the unrolled one and torch.compile at T <= 100),
with a second call in the same process, its run alone: first - second is what compiling
cost.  W13 is a data-dependent while loop: Newton's method for x^3 + a x = b on a float64
vector until max |f(x)| < 1e-12, tc.while_loop under tc.trace against jax.lax.while_loop
under jax.jit (float64 enabled) and Python loops in NumPy and PyTorch; the reference is
Cardano's formula, and each implementation's step count must be NumPy's (+- 1).
W15 (issue 36) is the call overhead of a traced function taking a whole model: x plus the
model's 1, 30 or 300 tensors of 8 floats, one fused kernel (w15_cases).  W16 is greedy
generation with a growing sequence, compiles included, per implementation in a fresh
process (generation.py: the GPT demo's model and a wider one, 128 tokens after 8).
W14 (issue 38) is six Hugging Face models (hf_models.py: GPT-2, BERT, Llama, ViT, ResNet,
T5 at small configurations) through torch.compile with backend="tracecomp" against
Inductor and eager: a training step with AdamW and the inference forward, batch 8.
W17 (issue 32) is a ResNet-style CNN (conv stem, BatchNorm, three residual blocks, adaptive
average pool, linear; batch 32 of 3x32x32): its SGD-with-momentum train step and its
inference forward, checked against PyTorch eager in float64 (w17_cases).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("tracecomp", "numpy", "torch", "torch.compile", "jax.jit")
ALL_WORKLOADS = ("W1", "W2", "W3", "W3b", "W4", "W4b", "W5", "W6", "W7", "W8", "W8a", "W8b", "W9", "W10", "W11", "W12", "W12c", "W13", "W14", "W15", "W16", "W17")
ROW_BUDGET_S = 40.0          # a slow implementation gets fewer repetitions past this
MIN_REP_S = 0.05             # a repetition of a fast call loops it this long at least
CHILD_TIMEOUT_S = 900.0
MATMUL_4096_LIMIT_S = 2.0    # tracecomp's 4096^3 matmul only runs if its 1024^3 took less
LR = 0.01

# ----------------------------------------------------------------------------- helpers


def aligned(a: np.ndarray, align: int = 64) -> np.ndarray:
    """A C-contiguous copy of `a` whose data starts on an `align`-byte boundary."""
    raw = np.empty(a.nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def fmt_time(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.2f} us"


@dataclass
class Row:
    workload: str
    case: str
    impl: str
    status: str = "ok"                 # ok | WRONG | skipped | error
    note: str = ""
    median_s: Optional[float] = None
    min_s: Optional[float] = None
    max_s: Optional[float] = None
    reps: int = 0
    calls_per_rep: int = 0
    first_call_s: Optional[float] = None
    error: Optional[float] = None      # verification error (normalized, see each check)
    floor_s: Optional[float] = None
    extra: dict = field(default_factory=dict)


def calibrate(fn: Callable[[], Any], repeat: int, before: Optional[Callable[[], Any]] = None) -> tuple[int, int]:
    """(repetitions, calls per repetition) for `fn`, already warmed up: a repetition lasts
    >= MIN_REP_S, and a slow call gets fewer repetitions (at least 3) within ROW_BUDGET_S."""
    one = time_rep(fn, 1, before)
    number = 1 if one >= MIN_REP_S else max(1, int(MIN_REP_S / max(one, 1e-9)))
    reps = repeat
    if one * repeat > ROW_BUDGET_S:
        reps = max(3, min(repeat, int(ROW_BUDGET_S / max(one, 1e-9))))
    return reps, number


def time_rep(fn: Callable[[], Any], number: int, before: Optional[Callable[[], Any]] = None) -> float:
    """Seconds per call of `fn`, over `number` calls; `before`, if given, runs (untimed)
    right before each call."""
    if before is None:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    total = 0.0
    for _ in range(number):
        before()
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
    return total / number


def rel_error(out, ref) -> float:
    """max |out - ref| / max |ref| over all arrays of a result (inf on a shape mismatch or a
    non-finite value)."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    if len(outs) != len(refs):
        return math.inf
    num, den = 0.0, 0.0
    for o, r in zip(outs, refs):
        o = np.asarray(o, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        if o.shape != r.shape or not np.all(np.isfinite(o)):
            return math.inf
        num = max(num, float(np.max(np.abs(o - r))) if o.size else 0.0)
        den = max(den, float(np.max(np.abs(r))) if r.size else 0.0)
    return num / den if den else num


def as_numpy(r):
    """NumPy arrays from any implementation's result (tc.Tensor, torch, jax, nested lists)."""
    if isinstance(r, (list, tuple)):
        return [as_numpy(v) for v in r]
    if hasattr(r, "detach"):
        r = r.detach()
        return (r.float() if str(r.dtype) == "torch.bfloat16" else r).numpy()
    return np.asarray(r)


# ----------------------------------------------------------------------------- builders
# A builder takes the case's inputs (NumPy arrays) and returns `call`, a function of no
# arguments that runs the implementation on inputs converted in advance and returns its
# result, blocked until ready.  Each is run in the process that times it.


def build_tracecomp(fn, inputs):
    import tracecomp as tc
    f = tc.trace(fn)
    args = [aligned(a) for a in inputs]        # aligned: the call path copies unaligned inputs
    return lambda: f(*args)


def build_numpy(fn, inputs):
    args = [np.ascontiguousarray(a) for a in inputs]
    return lambda: fn(*args)


def build_torch(fn, inputs, compiled: bool):
    import torch
    args = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    f = torch.compile(fn) if compiled else fn

    def call():
        with torch.no_grad():
            return f(*args)
    return call


def build_jax(fn, inputs):
    import jax
    args = [jax.device_put(a) for a in inputs]
    f = jax.jit(fn)
    return lambda: jax.block_until_ready(f(*args))


def standard(tc_fn, np_fn, torch_fn, jax_fn) -> dict[str, Callable]:
    return {"tracecomp": lambda inputs: build_tracecomp(tc_fn, inputs),
            "numpy": lambda inputs: build_numpy(np_fn, inputs),
            "torch": lambda inputs: build_torch(torch_fn, inputs, compiled=False),
            "torch.compile": lambda inputs: build_torch(torch_fn, inputs, compiled=True),
            "jax.jit": lambda inputs: build_jax(jax_fn, inputs)}


@dataclass
class Case:
    key: str                               # "W2-softmax": what a child process is told to run
    workload: str
    title: str
    inputs: Callable[[], list]             # NumPy arrays
    reference: Callable[[list], Any]       # NumPy float64 result (or what `error` compares to)
    tol: float
    impls: dict[str, Callable]             # name -> builder(inputs) -> call
    floor: Callable[[float, float], Optional[float]] = lambda bw, peak: None   # seconds
    error: Callable[[Any, Any], float] = rel_error
    note: str = ""
    # builders of a deterministic variant checked in place of the timed one, which is then
    # only checked for the result's shapes and finite values (W7's dropout: p = 0)
    check_impls: Optional[dict[str, Callable]] = None
    # run untimed right before every timed call, in the same process ("after NumPy")
    before_each: Optional[Callable[[], Any]] = None
    env: Optional[dict] = None             # environment of its child processes (not --in-process)
    timeouts: Optional[dict] = None        # impl -> seconds its child process gets (else CHILD_TIMEOUT_S)
    second_call: bool = False              # a cold run (--cold) also times a second call (W12c)


# ----------------------------------------------------------------------------- W1, W2, W3


def mem_floor(nbytes: int):
    return lambda bw, peak: nbytes / bw


def w1_cases() -> list[Case]:
    n = 1 << 24

    def inputs():
        return [np.random.default_rng(0).standard_normal(n).astype(np.float32)]

    def reference(inputs):
        x = inputs[0].astype(np.float64)
        return x / (1 + np.exp(-1.702 * x)) + 0.5 * np.sin(x) * np.exp(-x * x)

    def tc_fn(x):
        import tracecomp as tc
        return x * tc.sigmoid(1.702 * x) + 0.5 * tc.sin(x) * tc.exp(-x * x)

    def np_fn(x):
        return x / (1 + np.exp(np.float32(-1.702) * x)) + np.float32(0.5) * np.sin(x) * np.exp(-x * x)

    def torch_fn(x):
        import torch
        return x * torch.sigmoid(1.702 * x) + 0.5 * torch.sin(x) * torch.exp(-x * x)

    def jax_fn(x):
        import jax
        import jax.numpy as jnp
        return x * jax.nn.sigmoid(1.702 * x) + 0.5 * jnp.sin(x) * jnp.exp(-x * x)

    w1 = Case("W1", "W1", "x*sigmoid(1.702x) + 0.5 sin(x) exp(-x^2), 2^24 f32", inputs, reference, 1e-5,
              standard(tc_fn, np_fn, torch_fn, jax_fn), mem_floor(2 * 4 * n))
    return [w1, *after_numpy(w1)]


AFTER_NUMPY_N = 1024


@functools.cache
def _numpy_operand() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((AFTER_NUMPY_N, AFTER_NUMPY_N)).astype(np.float32)


def numpy_matmul() -> None:
    a = _numpy_operand()
    a @ a


def after_numpy(case: Case) -> list[Case]:
    """`case` with a NumPy 1024^3 f32 matmul (OpenBLAS, all its threads) run untimed right
    before every timed call, in the same process: how an implementation fares beside NumPy,
    whose idle BLAS threads keep spinning for 2^28 cycles after it returns (issue 15); and
    the same with that spin cut to 2^16 cycles, as tracecomp does when it is imported before
    NumPy (tracecomp/runtime/numpy_blas.py).  Here NumPy is always loaded first, so in the first row
    tracecomp runs OpenBLAS's jobs on its own threads (runtime/blas_team.py), and the
    peers keep OpenBLAS's spinning ones."""
    return [dataclasses.replace(case, key=f"{case.key}-after-numpy", before_each=numpy_matmul,
                                title=f"{case.title}, right after a NumPy matmul"),
            dataclasses.replace(case, key=f"{case.key}-after-numpy-short-spin", before_each=numpy_matmul,
                                title=f"{case.title}, right after a NumPy matmul, OPENBLAS_THREAD_TIMEOUT=16",
                                env={"OPENBLAS_THREAD_TIMEOUT": "16"})]


def w2_cases() -> list[Case]:
    n = 4096

    def inputs():
        rng = np.random.default_rng(0)
        return [rng.standard_normal((n, n)).astype(np.float32),
                (1 + 0.1 * rng.standard_normal(n)).astype(np.float32),
                (0.1 * rng.standard_normal(n)).astype(np.float32)]

    def ref_softmax(inputs):
        x = inputs[0].astype(np.float64)
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def ref_layernorm(inputs):
        x, w, b = (a.astype(np.float64) for a in inputs)
        mu = x.mean(1, keepdims=True)
        var = ((x - mu) ** 2).mean(1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w + b

    def tc_sm(x):
        import tracecomp as tc
        return tc.softmax(x, dim=1)

    def np_sm(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def torch_sm(x):
        import torch
        return torch.softmax(x, dim=1)

    def jax_sm(x):
        import jax
        return jax.nn.softmax(x, axis=1)

    def tc_ln(x, w, b):
        import tracecomp as tc
        return tc.layer_norm(x, [n], w, b)

    def np_ln(x, w, b):
        mu = x.mean(1, keepdims=True)
        c = x - mu
        return c / np.sqrt((c * c).mean(1, keepdims=True) + np.float32(1e-5)) * w + b

    def torch_ln(x, w, b):
        import torch
        return torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5)

    def jax_ln(x, w, b):
        import jax.numpy as jnp
        mu = x.mean(1, keepdims=True)
        c = x - mu
        return c * (1 / jnp.sqrt((c * c).mean(1, keepdims=True) + 1e-5)) * w + b

    floor = mem_floor(2 * 4 * n * n)
    return [Case("W2-softmax", "W2", "row softmax 4096x4096 f32", lambda: inputs()[:1], ref_softmax, 1e-5,
                 standard(tc_sm, np_sm, torch_sm, jax_sm), floor),
            Case("W2-layernorm", "W2", "layernorm (weight, bias) 4096x4096 f32", inputs, ref_layernorm, 1e-5,
                 standard(tc_ln, np_ln, torch_ln, jax_ln), floor)]


def w3_cases(sizes=(1024, 4096)) -> list[Case]:
    def mm(a, b):
        return a @ b

    def jax_mm(a, b):
        import jax.numpy as jnp
        return jnp.matmul(a, b)

    cases = []
    for n in sizes:
        def inputs(n=n):
            rng = np.random.default_rng(n)
            return [rng.standard_normal((n, n)).astype(np.float32) for _ in range(2)]

        def reference(inputs):
            return inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
        # error / max|ref|: fp32 sums over n terms stay far below 1e-5 of the largest entry
        cases.append(Case(f"W3-{n}", "W3", f"matmul {n}^3 f32", inputs, reference, 1e-5,
                          standard(mm, mm, mm, jax_mm), lambda bw, peak, n=n: 2 * n ** 3 / peak))
        if n == 1024:
            cases += after_numpy(cases[-1])
    return cases


# ----------------------------------------------------------------------------- W3b
# (issue 37) W3's product with bfloat16 operands and result, accumulated in float32:
# tracecomp's packed kernel (vdpbf16ps where the CPU has AVX512-BF16: `tracecomp info`
# prints the path) against torch (oneDNN) and jax in bfloat16.  Its ratio to tracecomp's
# float32 W3 comes from running both: --workloads W3,W3b.


def w3b_cases(sizes=(1024, 4096)) -> list[Case]:
    import ml_dtypes

    def mm(a, b):
        return a @ b

    def jax_mm(a, b):
        import jax.numpy as jnp
        return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    def torch_bf16(inputs):
        import torch
        args = [torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) for a in inputs]

        def call():
            with torch.no_grad():
                return args[0] @ args[1]
        return call
    standard_impls = standard(mm, mm, mm, jax_mm)
    impls = {"tracecomp": standard_impls["tracecomp"], "torch": torch_bf16, "jax.jit": standard_impls["jax.jit"]}
    # W3's cases with their operands rounded to bfloat16 (its float64 reference of them);
    # one bfloat16 rounding of the result: 2^-9 of each entry, under 1e-2 of the largest
    return [dataclasses.replace(c, key=f"W3b-{n}", workload="W3b", title=f"matmul {n}^3 bf16",
                                inputs=lambda c=c: [a.astype(ml_dtypes.bfloat16) for a in c.inputs()], tol=1e-2,
                                impls=impls, floor=lambda bw, peak, n=n: n ** 3 / peak,
                                note="bf16 operands and result, f32 accumulation; floor: two bf16 products per f32 FMA")
            for n in sizes for c in w3_cases((n,)) if c.key == f"W3-{n}"]


# ----------------------------------------------------------------------------- W4

W4_SIZES = (784, 512, 512, 10)
W4_BATCH = 256


def w4_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = []
    for a, b in zip(W4_SIZES[:-1], W4_SIZES[1:]):
        params.append((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))
        params.append((0.1 * rng.standard_normal(b)).astype(np.float32))
    x = rng.standard_normal((W4_BATCH, W4_SIZES[0])).astype(np.float32)
    y = rng.integers(0, W4_SIZES[-1], W4_BATCH).astype(np.int64)
    return params, x, y


def w4_numpy(params, x, y, lr=LR):
    """The hand-written train step: forward, softmax cross-entropy, backward, SGD.
    Works in the dtype of its inputs (float64 for the reference)."""
    w1, b1, w2, b2, w3, b3 = params
    h1p = x @ w1 + b1
    h1 = np.maximum(h1p, 0)
    h2p = h1 @ w2 + b2
    h2 = np.maximum(h2p, 0)
    logits = h2 @ w3 + b3
    s = logits - logits.max(1, keepdims=True)
    e = np.exp(s)
    se = e.sum(1, keepdims=True)
    rows = np.arange(len(y))
    loss = -(s[rows, y] - np.log(se[:, 0])).mean()
    d = e / se
    d[rows, y] -= 1
    d /= len(y)
    dw3, db3 = h2.T @ d, d.sum(0)
    d2 = (d @ w3.T) * (h2p > 0)
    dw2, db2 = h1.T @ d2, d2.sum(0)
    d1 = (d2 @ w2.T) * (h1p > 0)
    dw1, db1 = x.T @ d1, d1.sum(0)
    grads = (dw1, db1, dw2, db2, dw3, db3)
    lr = x.dtype.type(lr)
    return [loss] + [p - lr * g for p, g in zip(params, grads)]


def w4_tracecomp_step(bf16: bool = False):
    import tracecomp as tc

    def loss_fn(w1, b1, w2, b2, w3, b3, x, y):
        h = tc.relu(x @ w1 + b1)
        h = tc.relu(h @ w2 + b2)
        return tc.cross_entropy(h @ w3 + b3, y)

    vg = tc.value_and_grad(tc.autocast(tc.bfloat16)(loss_fn) if bf16 else loss_fn, argnums=(0, 1, 2, 3, 4, 5))

    def step(w1, b1, w2, b2, w3, b3, x, y):
        params = (w1, b1, w2, b2, w3, b3)
        loss, grads = vg(*params, x, y)
        return [loss] + [p - LR * g for p, g in zip(params, grads)]
    return tc.trace(step)


def w4_torch_step(torch, compiled: bool, bf16: bool = False):
    import torch.nn.functional as F

    def loss_fn(w1, b1, w2, b2, w3, b3, x, y):
        h = torch.relu(x @ w1 + b1)
        h = torch.relu(h @ w2 + b2)
        return F.cross_entropy(h @ w3 + b3, y)
    if bf16:
        loss_fn = torch.autocast("cpu", torch.bfloat16)(loss_fn)

    if not compiled:
        def step(*args):
            params = [p.detach().requires_grad_() for p in args[:6]]
            loss = loss_fn(*params, *args[6:])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                return [loss.detach()] + [p - LR * g for p, g in zip(params, grads)]
        return step
    # the whole step (forward, backward, update) in one compiled function
    vg = torch.func.grad_and_value(loss_fn, argnums=(0, 1, 2, 3, 4, 5))

    def step(*args):
        grads, loss = vg(*args)
        return [loss] + [p - LR * g for p, g in zip(args[:6], grads)]
    return torch.compile(step)


def w4_jax_step(jax):
    import jax.numpy as jnp

    def loss_fn(params, x, y):
        w1, b1, w2, b2, w3, b3 = params
        h = jax.nn.relu(x @ w1 + b1)
        h = jax.nn.relu(h @ w2 + b2)
        logp = jax.nn.log_softmax(h @ w3 + b3, axis=1)
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return [loss] + [p - LR * g for p, g in zip(params, grads)]
    return jax.jit(step)


def w4_error(out, ref_and_params) -> float:
    """Loss: relative error.  Parameters: max |new - ref_new| / max |ref_new - old| per
    tensor, i.e. the error relative to the size of the SGD update (checks the gradients)."""
    ref, params = ref_and_params
    out = [np.asarray(o, np.float64) for o in out]
    if len(out) != len(ref):
        return math.inf
    err = abs(float(out[0]) - float(ref[0])) / abs(float(ref[0]))
    for o, r, p in zip(out[1:], ref[1:], params):
        if o.shape != r.shape or not np.all(np.isfinite(o)):
            return math.inf
        update = np.max(np.abs(r - p.astype(np.float64)))
        err = max(err, float(np.max(np.abs(o - r))) / update)
    return err


def w4_flops() -> int:
    fwd = sum(2 * W4_BATCH * a * b for a, b in zip(W4_SIZES[:-1], W4_SIZES[1:]))
    dx = sum(2 * W4_BATCH * a * b for a, b in zip(W4_SIZES[1:-1], W4_SIZES[2:]))   # no dx for layer 1
    return 2 * fwd + dx        # forward + weight gradients + input gradients of layers 2, 3


def w4_cases() -> list[Case]:
    def inputs():
        params, x, y = w4_data()
        return params + [x, y]

    def reference(inputs):
        params, x, y = inputs[:6], inputs[6], inputs[7]
        return (w4_numpy([p.astype(np.float64) for p in params], x.astype(np.float64), y), params)

    def b_tracecomp(inputs):
        f = w4_tracecomp_step()
        args = [aligned(v) for v in inputs]
        return lambda: f(*args)

    def b_numpy(inputs):
        params, x, y = inputs[:6], inputs[6], inputs[7]
        return lambda: w4_numpy(params, x, y)

    def b_torch(compiled):
        def build(inputs):
            import torch
            step = w4_torch_step(torch, compiled)
            args = [torch.from_numpy(v) for v in inputs]
            return lambda: step(*args)
        return build

    def b_jax(inputs):
        import jax
        step = w4_jax_step(jax)
        params = [jax.device_put(v) for v in inputs[:6]]
        x, y = jax.device_put(inputs[6]), jax.device_put(inputs[7].astype(np.int32))
        return lambda: jax.block_until_ready(step(params, x, y))

    params, x, y = w4_data()
    nbytes = 2 * sum(p.nbytes for p in params) + x.nbytes + y.nbytes
    flops = w4_flops()
    return [Case("W4", "W4", "MLP train step 256x784-512-512-10 f32 (fwd, bwd, SGD)", inputs, reference, 1e-3,
                 {"tracecomp": b_tracecomp, "numpy": b_numpy, "torch": b_torch(False),
                  "torch.compile": b_torch(True), "jax.jit": b_jax},
                 lambda bw, peak: max(flops / peak, nbytes / bw), w4_error,
                 note=f"{flops / 1e6:.0f} MFLOP, {nbytes / 1e6:.1f} MB in+out")]


# ----------------------------------------------------------------------------- W6


def w6_cases() -> list[Case]:
    def inputs():
        return [np.arange(8, dtype=np.float32)]

    def add1(x):
        return x + 1

    return [Case("W6", "W6", "x + 1 on 8 f32 (per-call overhead)", inputs,
                 lambda inputs: inputs[0].astype(np.float64) + 1, 0.0, standard(add1, add1, add1, add1))]


# ----------------------------------------------------------------------------- W14
# (issue 38) Hugging Face models through torch.compile: tracecomp's backend, Inductor and
# eager (hf_models.py); only where `transformers` is installed (a test-only dependency).


def w14_cases() -> list[Case]:
    if importlib.util.find_spec("transformers") is None:
        return []
    sys.path.insert(0, HERE)
    from hf_models import w14_cases as cases
    return cases(Case)


# ----------------------------------------------------------------------------- W15
# (issue 36) The call overhead of a traced function that takes a whole model: x (8 f32) plus
# each of the model's n tensors (8 f32 each), one fused kernel everywhere, so the time is
# the call path's work per tensor.  tracecomp and torch.compile take a module (tc.nn /
# torch.nn) with n parameters; jax.jit takes them as a pytree (a list), as JAX users pass
# parameters; NumPy takes the list.  Target: n = 30 at most 5 us more than n = 1.

W15_SIZES = (1, 30, 300)


def w15_sum(x, params):
    out = x
    for p in params:
        out = out + p
    return out


def w15_cases() -> list[Case]:
    cases = []
    for n in W15_SIZES:
        def inputs(n=n):
            rng = np.random.default_rng(n)
            return [rng.standard_normal(8).astype(np.float32) for _ in range(n + 1)]

        def reference(inputs):
            return w15_sum(inputs[0].astype(np.float64), [p.astype(np.float64) for p in inputs[1:]])

        def b_tracecomp(inputs):
            import tracecomp as tc

            class Model(tc.nn.Module):
                def __init__(self, arrays):
                    super().__init__()
                    for i, a in enumerate(arrays):
                        setattr(self, f"p{i}", tc.nn.Parameter(tc.tensor(aligned(a))))
            model = Model(inputs[1:])
            f = tc.trace(lambda m, x: w15_sum(x, list(m.parameters())))
            x = tc.tensor(aligned(inputs[0]))
            return lambda: f(model, x)

        def b_torch(compiled):
            def build(inputs):
                import torch

                class Model(torch.nn.Module):
                    def __init__(self, arrays):
                        super().__init__()
                        for i, a in enumerate(arrays):
                            setattr(self, f"p{i}", torch.nn.Parameter(torch.from_numpy(a.copy())))
                model = Model(inputs[1:])
                fn = lambda m, x: w15_sum(x, list(m.parameters()))      # noqa: E731
                f = torch.compile(fn) if compiled else fn
                x = torch.from_numpy(inputs[0].copy())

                def call():
                    with torch.no_grad():
                        return f(model, x)
                return call
            return build

        def b_jax(inputs):
            import jax
            params = [jax.device_put(a) for a in inputs[1:]]
            f = jax.jit(lambda params, x: w15_sum(x, params))
            x = jax.device_put(inputs[0])
            return lambda: jax.block_until_ready(f(params, x))

        def b_numpy(inputs):
            x, params = inputs[0], inputs[1:]
            return lambda: w15_sum(x, params)

        impls = {"tracecomp": b_tracecomp, "numpy": b_numpy, "torch": b_torch(False),
                 "torch.compile": b_torch(True), "jax.jit": b_jax}
        cases.append(Case(f"W15-{n}", "W15", f"call overhead: x + the {n} tensors of a model (8 f32 each)",
                          inputs, reference, 1e-5, impls,
                          note="one fused kernel; the model (tc.nn / torch.nn module, jax pytree) is an argument"))
    return cases


# ----------------------------------------------------------------------------- W7, W8
# Issue 12's layer workloads: a CNN train step (W7) and a GPT-style block train step (W8),
# each also as its forward alone.  One loss function serves tracecomp and PyTorch, given
# `tracecomp.nn.functional` or `torch.nn.functional` as F (the same names and semantics);
# jax has its own.  The reference is PyTorch eager in float64 (autograd), not NumPy: a
# hand-written NumPy backward of these layers would be a second program to trust.

W7_BATCH = 64
W7_SHAPES = ((32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 9216), (128,), (10, 128), (10,))
W7_P = 0.25                  # dropout when timed; the check runs the same step with p = 0


def w7_data(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    params = []
    for w, b in zip(W7_SHAPES[::2], W7_SHAPES[1::2]):
        params.append((rng.standard_normal(w) / np.sqrt(np.prod(w[1:]))).astype(np.float32))
        params.append((0.1 * rng.standard_normal(b)).astype(np.float32))
    x = rng.standard_normal((W7_BATCH, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, W7_BATCH).astype(np.int64)
    return params + [x, y]


def w7_loss(F, params, x, y, p):
    """conv 3x3 1->32, ReLU, conv 3x3 32->64, ReLU, max-pool 2, dropout p, linear 9216->128,
    ReLU, linear 128->10, cross-entropy: tracecomp and PyTorch (F is their nn.functional)."""
    c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = params
    h = F.relu(F.conv2d(x, c1w, c1b))
    h = F.relu(F.conv2d(h, c2w, c2b))
    h = F.dropout(F.max_pool2d(h, 2), p)
    h = F.relu(F.linear(h.reshape(W7_BATCH, 9216), f1w, f1b))
    return F.cross_entropy(F.linear(h, f2w, f2b), y)


def w7_jax_loss(params, x, y, p, key):
    import jax
    import jax.numpy as jnp
    from jax import lax
    c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = params

    def conv(h, w, b):
        return lax.conv_general_dilated(h, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")) \
            + b[:, None, None]
    h = jax.nn.relu(conv(x, c1w, c1b))
    h = jax.nn.relu(conv(h, c2w, c2b))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    if p > 0:
        h = jnp.where(jax.random.bernoulli(key, 1 - p, h.shape), h / (1 - p), 0)
    h = jax.nn.relu(h.reshape(W7_BATCH, 9216) @ f1w.T + f1b)
    logp = jax.nn.log_softmax(h @ f2w.T + f2b, axis=1)
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


def w7_flops() -> tuple[int, int]:
    """(forward, train step) matmul and conv FLOPs: 2 x multiply-adds.  The step is the
    forward, the weight gradients (as much again) and the input gradients of every layer
    but the first (as much as that layer's forward)."""
    conv1 = 2 * W7_BATCH * 32 * 26 * 26 * (1 * 9)
    conv2 = 2 * W7_BATCH * 64 * 24 * 24 * (32 * 9)
    fc1, fc2 = 2 * W7_BATCH * 9216 * 128, 2 * W7_BATCH * 128 * 10
    fwd = conv1 + conv2 + fc1 + fc2
    return fwd, 3 * fwd - conv1


W8_VOCAB, W8_D, W8_HEADS, W8_BATCH, W8_SEQ = 512, 384, 6, 8, 256
W8_LR, W8_BETAS, W8_EPS, W8_WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
W8_STEP = 10                 # AdamW's step count: moments as after 9 steps (see w8_data)
W8_GRAD_SCALE = {"w": 1e-3, "one": 3e-3, "zero": 3e-3}    # about the gradients' size, per kind


def w8_shapes() -> list[tuple[tuple, str]]:
    """(shape, init) of each parameter: "w" a matrix, "one" a layer norm's weight, "zero" a bias."""
    d, v, t = W8_D, W8_VOCAB, W8_SEQ
    ln = [((d,), "one"), ((d,), "zero")]
    return [((v, d), "w"), ((t, d), "w")] \
        + ln + [((3 * d, d), "w"), ((3 * d,), "zero"), ((d, d), "w"), ((d,), "zero")] \
        + ln + [((4 * d, d), "w"), ((4 * d,), "zero"), ((d, 4 * d), "w"), ((d,), "zero")] \
        + ln + [((v, d), "w")]                   # ln1, attention, ln2, MLP, final ln, head (untied)


def w8_data(seed: int = 0) -> list:
    """Parameters, AdamW's first and second moments, tokens and next tokens.  The moments
    are those of a run in progress (the second one bounded away from 0), so that the update
    m / (sqrt(v) + eps) is a smooth function of the gradient: with v = 0 it would be
    lr x sign(g), which a float32 gradient near 0 may flip."""
    rng = np.random.default_rng(seed)
    params, ms, vs = [], [], []
    for shape, init in w8_shapes():
        p = rng.standard_normal(shape) / np.sqrt(shape[1]) if init == "w" else \
            (init == "one") + 0.02 * rng.standard_normal(shape)
        params.append(p.astype(np.float32))
        scale = W8_GRAD_SCALE[init]
        ms.append((scale * rng.standard_normal(shape)).astype(np.float32))
        vs.append((scale ** 2 * rng.uniform(0.5, 2.0, shape)).astype(np.float32))
    tokens = rng.integers(0, W8_VOCAB, (W8_BATCH, W8_SEQ + 1)).astype(np.int64)
    return params + ms + vs + [np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])]


def w8_loss(F, params, x, y):
    """Embedding plus learned positions, pre-norm causal attention (6 heads of 64) and GELU
    MLP (4x) blocks with residuals, a final layer norm, an untied head to the vocabulary,
    cross-entropy on the next tokens: tracecomp and PyTorch (F is their nn.functional)."""
    wte, wpe, l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, wfc, bfc, wpr, bpr, lfw, lfb, whead = params
    (b, t), d, nh = x.shape, W8_D, W8_HEADS       # any batch: a data-parallel shard too
    h = F.embedding(x, wte) + wpe
    qkv = F.linear(F.layer_norm(h, [d], l1w, l1b), wqkv, bqkv).reshape(b, t, 3, nh, d // nh).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = h + F.linear(a.transpose(1, 2).reshape(b, t, d), wo, bo)
    h = h + F.linear(F.gelu(F.linear(F.layer_norm(h, [d], l2w, l2b), wfc, bfc)), wpr, bpr)
    logits = F.linear(F.layer_norm(h, [d], lfw, lfb), whead)
    return F.cross_entropy(logits.reshape(b * t, W8_VOCAB), y.reshape(b * t))


def w8_jax_loss(params, x, y):
    import jax
    import jax.numpy as jnp
    wte, wpe, l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, wfc, bfc, wpr, bpr, lfw, lfb, whead = params
    (b, t), d, nh = x.shape, W8_D, W8_HEADS       # any batch: a data-parallel shard too

    def ln(h, w, bias):
        mu = h.mean(-1, keepdims=True)
        c = h - mu
        return c * jax.lax.rsqrt((c * c).mean(-1, keepdims=True) + 1e-5) * w + bias
    h = wte[x] + wpe
    qkv = (ln(h, l1w, l1b) @ wqkv.T + bqkv).reshape(b, t, 3, nh, d // nh)       # (B, T, N, H): jax's layout
    a = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True)
    h = h + a.reshape(b, t, d) @ wo.T + bo
    h = h + jax.nn.gelu(ln(h, l2w, l2b) @ wfc.T + bfc, approximate=False) @ wpr.T + bpr
    logp = jax.nn.log_softmax(ln(h, lfw, lfb) @ whead.T, axis=-1).reshape(b * t, W8_VOCAB)
    return -jnp.take_along_axis(logp, y.reshape(b * t, 1), axis=1).mean()


def adamw(params, grads, state) -> list:
    """One AdamW step (PyTorch's: decoupled weight decay, bias-corrected moments) as
    functional math on any library's arrays: state is the first moments then the second
    ones; returns the new params, first and second moments."""
    ms, vs = state[:len(params)], state[len(params):]
    b1, b2 = W8_BETAS
    c1, c2 = 1 - b1 ** W8_STEP, 1 - b2 ** W8_STEP
    new_p, new_m, new_v = [], [], []
    for p, g, m, v in zip(params, grads, ms, vs):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * (g * g)
        new_p.append(p * (1 - W8_LR * W8_WD) - W8_LR * (m / c1) / ((v / c2) ** 0.5 + W8_EPS))
        new_m.append(m)
        new_v.append(v)
    return new_p + new_m + new_v


def sgd(params, grads, state) -> list:
    return [p - LR * g for p, g in zip(params, grads)]


def w8_flops() -> tuple[int, int]:
    """(forward, train step) matmul FLOPs.  Per token: the qkv, attention-out, MLP and head
    matmuls (2 x d x (3d + d + 4d + 4d + V)); attention, q k^T and the weights times v over
    the causal half only (T (T + 1) / 2 pairs, 2 x 2 x head dim each, per head).  The step
    is 3 x the forward: no layer's input gradient is left out (the first is an embedding)."""
    d, n = W8_D, W8_BATCH * W8_SEQ
    linear = 2 * n * d * (12 * d + W8_VOCAB)
    attention = W8_BATCH * W8_HEADS * (W8_SEQ * (W8_SEQ + 1) // 2) * 4 * (d // W8_HEADS)
    return linear + attention, 3 * (linear + attention)


# A workload's train step in each library.  Its arguments are `nstate` state arrays (the
# `nparams` parameters first, then the optimizer's state) and then the data; it returns
# [loss] + the new state.  `loss(params, *data)`; `update(params, grads, opt_state)`.


def tc_step(loss, nparams: int, nstate: int, update):
    import tracecomp as tc
    vg = tc.value_and_grad(lambda *a: loss(a[:nparams], *a[nparams:]), argnums=tuple(range(nparams)))

    def step(*args):
        value, grads = vg(*args[:nparams], *args[nstate:])
        return [value] + update(list(args[:nparams]), list(grads), list(args[nparams:nstate]))
    return tc.trace(step)


def torch_step(loss, nparams: int, nstate: int, update, compiled: bool):
    import torch
    if not compiled:
        def step(*args):
            params = [a.detach().requires_grad_() for a in args[:nparams]]
            value = loss(params, *args[nstate:])
            grads = torch.autograd.grad(value, params)
            with torch.no_grad():
                return [value.detach()] + update(list(args[:nparams]), list(grads), list(args[nparams:nstate]))
        return step
    # the whole step (forward, backward, update) in one compiled function, as W4
    vg = torch.func.grad_and_value(lambda *a: loss(a[:nparams], *a[nparams:]), argnums=tuple(range(nparams)))

    def step(*args):
        grads, value = vg(*args[:nparams], *args[nstate:])
        return [value] + update(list(args[:nparams]), list(grads), list(args[nparams:nstate]))
    return torch.compile(step)


def jax_step(loss, nparams: int, nstate: int, update):
    import jax

    def step(state, data):
        value, grads = jax.value_and_grad(lambda ps: loss(ps, *data))(state[:nparams])
        return [value] + update(state[:nparams], list(grads), state[nparams:])
    return jax.jit(step)


def torch_f64(fn, inputs, **kw):
    """PyTorch eager in float64 on the inputs: the reference of W7 and W8."""
    import torch
    args = [torch.from_numpy(a.astype(np.float64) if a.dtype == np.float32 else a) for a in inputs]
    return as_numpy(fn(*args, **kw))


def layer_builders(kind: str, losses: Callable, nparams: int, nstate: int, update) -> dict:
    """Builders for a forward (kind "fwd": the loss alone) or a train step ("step") of the
    losses that `losses()` returns (tracecomp's, PyTorch's, jax's), on tracecomp, torch
    eager, torch.compile and jax.jit.  jax gets its integer data as int32 (its default
    integer type), and a PRNG key after the data when its loss takes one (`needs_key`)."""
    def b_tracecomp(inputs):
        import tracecomp as tc
        tc_loss = losses()[0]
        f = tc_step(tc_loss, nparams, nstate, update) if kind == "step" else \
            tc.trace(lambda *a: tc_loss(a[:nparams], *a[nstate:]))
        args = [aligned(a) for a in inputs]
        call = lambda: f(*args)     # noqa: E731
        call.traced, call.args = f, args            # for the first-call stages and profiles
        return call

    def b_torch(compiled):
        def build(inputs):
            import torch
            torch_loss = losses()[1]
            args = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
            if kind == "step":
                f = torch_step(torch_loss, nparams, nstate, update, compiled)
                return lambda: f(*args)
            g = lambda *a: torch_loss(a[:nparams], *a[nstate:])    # noqa: E731
            return build_torch(g, inputs, compiled)
        return build

    def b_jax(inputs):
        import jax
        state = [jax.device_put(a) for a in inputs[:nstate]]
        data = [jax.device_put(a.astype(np.int32) if a.dtype == np.int64 else a) for a in inputs[nstate:]]
        jax_loss = losses()[2]
        if getattr(jax_loss, "needs_key", False):
            data.append(jax.random.key(0))      # an argument: the mask is drawn at run time, every call
        if kind == "step":
            f = jax_step(jax_loss, nparams, nstate, update)
            return lambda: jax.block_until_ready(f(state, data))
        f = jax.jit(lambda ps, data: jax_loss(ps, *data))
        return lambda: jax.block_until_ready(f(state[:nparams], data))
    return {"tracecomp": b_tracecomp, "torch": b_torch(False), "torch.compile": b_torch(True), "jax.jit": b_jax}


def layer_reference(kind: str, losses: Callable, nparams: int, nstate: int, update):
    """PyTorch eager in float64: the result layer_builders' calls are checked against (with,
    for a step, the old state, which step_error needs)."""
    def reference(inputs):
        import torch
        torch_loss = losses()[1]
        if kind == "fwd":
            with torch.no_grad():
                return torch_f64(lambda *a: torch_loss(a[:nparams], *a[nstate:]), inputs)
        return (torch_f64(torch_step(torch_loss, nparams, nstate, update, False), inputs), inputs[:nstate])
    return reference


def w7_losses(p: float) -> Callable:
    def tc_loss(params, x, y):
        import tracecomp.nn.functional as F
        return w7_loss(F, params, x, y, p)

    def torch_loss(params, x, y):
        import torch.nn.functional as F
        return w7_loss(F, params, x, y, p)

    def jax_loss(params, x, y, key):
        return w7_jax_loss(params, x, y, p, key)
    jax_loss.needs_key = True
    return lambda: (tc_loss, torch_loss, jax_loss)


def w8_losses() -> tuple:
    def tc_loss(params, x, y):
        import tracecomp.nn.functional as F
        return w8_loss(F, params, x, y)

    def torch_loss(params, x, y):
        import torch.nn.functional as F
        return w8_loss(F, params, x, y)
    return tc_loss, torch_loss, w8_jax_loss


def w7_cases() -> list[Case]:
    """The CNN step and its forward, timed with dropout p = W7_P and checked with p = 0 (the
    same program otherwise: `Case.check_impls`); the second conv's forward alone."""
    if not installed("torch"):
        return [w7_conv_case()]     # the others' reference is PyTorch in float64
    fwd_flops, step_flops = w7_flops()
    cases = []
    for kind, flops, title in (("fwd", fwd_flops, "forward (loss)"), ("step", step_flops, "train step (fwd, bwd, SGD)")):
        cases.append(Case(f"W7-{kind}", "W7", f"CNN {title}, batch 64 of 1x28x28, dropout {W7_P} f32", w7_data,
                          layer_reference(kind, w7_losses(0.0), 8, 8, sgd), 1e-3,
                          layer_builders(kind, w7_losses(W7_P), 8, 8, sgd),
                          lambda bw, peak, flops=flops: flops / peak, rel_error if kind == "fwd" else w4_error,
                          note=f"{flops / 1e9:.2f} GFLOP; checked with dropout p=0",
                          check_impls=layer_builders(kind, w7_losses(0.0), 8, 8, sgd)))
    return cases + [w7_conv_case()]


def w7_conv_case() -> Case:
    """The second conv's forward alone: 64x32x26x26 input, 64 3x3 filters, bias."""
    def inputs():
        rng = np.random.default_rng(1)
        return [rng.standard_normal((W7_BATCH, 32, 26, 26)).astype(np.float32),
                (rng.standard_normal((64, 32, 3, 3)) / np.sqrt(288)).astype(np.float32),
                (0.1 * rng.standard_normal(64)).astype(np.float32)]

    def np_conv(x, w, b):           # the windows as a view, then one tensordot (BLAS)
        win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))      # N, C, OH, OW, 3, 3
        return np.tensordot(win, w, axes=((1, 4, 5), (1, 2, 3))).transpose(0, 3, 1, 2) + b[:, None, None]

    def tc_conv(x, w, b):
        import tracecomp as tc
        return tc.conv2d(x, w, b)

    def torch_conv(x, w, b):
        import torch
        return torch.nn.functional.conv2d(x, w, b)

    def jax_conv(x, w, b):
        from jax import lax
        return lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")) \
            + b[:, None, None]
    flops = 2 * W7_BATCH * 64 * 24 * 24 * 32 * 9
    return Case("W7-conv", "W7", "conv2d 64x32x26x26 * 64x32x3x3 + bias (W7's second conv) f32", inputs,
                lambda inputs: np_conv(*(a.astype(np.float64) for a in inputs)), 1e-5,
                standard(tc_conv, np_conv, torch_conv, jax_conv), lambda bw, peak: flops / peak,
                note=f"{flops / 1e9:.2f} GFLOP")


def w8_cases() -> list[Case]:
    """The GPT-style block's AdamW step and its forward (no dropout: deterministic)."""
    if not installed("torch"):
        return []                   # the reference is PyTorch in float64
    fwd_flops, step_flops = w8_flops()
    n = len(w8_shapes())
    cases = []
    for kind, flops, title in (("fwd", fwd_flops, "forward (loss)"), ("step", step_flops, "train step (fwd, bwd, AdamW)")):
        cases.append(Case(f"W8-{kind}", "W8", f"GPT block {title}, batch 8 x 256 tokens, d 384, 6 heads f32", w8_data,
                          layer_reference(kind, w8_losses, n, 3 * n, adamw), 1e-3,
                          layer_builders(kind, w8_losses, n, 3 * n, adamw),
                          lambda bw, peak, flops=flops: flops / peak, rel_error if kind == "fwd" else w4_error,
                          note=f"{flops / 1e9:.2f} GFLOP"))
    return cases + [w8_attention_case()]


def w8_attention_case() -> Case:
    """W8's attention alone, forward and backward: causal scaled_dot_product_attention over
    8 x 6 heads of 256 x 64, the gradients of <out, g> for q, k and v.  PyTorch runs its CPU
    flash kernels (torch.func.vjp, which torch.compile traces), jax jax.nn.dot_product_attention."""
    shape = (8, 6, 256, 64)

    def inputs():
        rng = np.random.default_rng(2)
        return [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]      # q, k, v, g

    def np_grads(q, k, v, g):
        s = np.where(np.tril(np.ones((256, 256), bool)), q @ np.swapaxes(k, -1, -2) / 8, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        dp = g @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / 8
        return [ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g]

    def tc_fn(q, k, v, g):
        import tracecomp as tc
        return tc.vjp(lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)[1](g)

    def torch_fn(q, k, v, g):
        import torch
        attention = torch.nn.functional.scaled_dot_product_attention
        return torch.func.vjp(lambda q, k, v: attention(q, k, v, is_causal=True), q, k, v)[1](g)

    def jax_fn(q, k, v, g):
        import jax
        def attention(q, k, v):         # jax's layout is (batch, tokens, heads, features)
            t = lambda x: x.transpose(0, 2, 1, 3)
            return t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True))
        return jax.vjp(attention, q, k, v)[1](g)
    flops = 6 * 8 * 6 * (256 * 257 // 2) * 64 * 2     # the causal half of 2 products forward, 4 backward
    impls = standard(tc_fn, None, torch_fn, jax_fn)
    del impls["numpy"]
    return Case("W8-attn", "W8", "causal attention forward + backward, 8 x 6 heads of 256 x 64 f32", inputs,
                lambda inputs: np_grads(*(a.astype(np.float64) for a in inputs)), 1e-4, impls,
                lambda bw, peak: flops / peak, note=f"{flops / 1e9:.2f} GFLOP")


# ----------------------------------------------------------------------------- W17
# Issue 32's ResNet-style CNN: a 3x3 conv stem to W17_C channels with BatchNorm and ReLU,
# three residual blocks (conv, BN, ReLU, conv, BN, + the block's input, ReLU), adaptive
# average pool to 1x1, a linear head; batch 32 of 3x32x32.  The step is cross-entropy's
# value and gradients with BatchNorm on the batch's statistics, then SGD with momentum and
# weight decay (PyTorch's rule); the inference forward is the logits with BatchNorm on
# running statistics.  The convs have no bias (BatchNorm's shift follows each).

W17_BATCH, W17_C, W17_BLOCKS, W17_CLASSES = 32, 16, 3, 10
W17_MOMENTUM, W17_WD = 0.9, 5e-4
# BatchNorm's float32 gradient cancels over 32768 values per channel: every library's step
# is 3.4e-4 off the float64 one relative to the update (torch.compile's 1.0e-3)
W17_STEP_TOL = 3e-3


def w17_shapes() -> list[tuple[tuple, str]]:
    """(shape, init) of each parameter: "w" a conv or linear weight, "one" a BatchNorm
    weight, "zero" a shift or bias."""
    c = W17_C
    bn = [((c,), "one"), ((c,), "zero")]
    block = [((c, c, 3, 3), "w")] + bn + [((c, c, 3, 3), "w")] + bn
    return [((c, 3, 3, 3), "w")] + bn + block * W17_BLOCKS + [((W17_CLASSES, c), "w"), ((W17_CLASSES,), "zero")]


def w17_params(rng) -> list:
    """Weights scaled by 1 / sqrt(fan-in), BatchNorm weights near 1, shifts near 0."""
    return [(rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:])) if init == "w" else
             (init == "one") + 0.1 * rng.standard_normal(shape)).astype(np.float32) for shape, init in w17_shapes()]


def w17_images(rng) -> np.ndarray:
    return rng.standard_normal((W17_BATCH, 3, 32, 32)).astype(np.float32)


def w17_step_data(seed: int = 0) -> list:
    """Parameters, momentum buffers (those of a run in progress: the update is then not the
    gradient alone), images and labels."""
    rng = np.random.default_rng(seed)
    params = w17_params(rng)
    bufs = [(0.01 * rng.standard_normal(p.shape)).astype(np.float32) for p in params]
    y = rng.integers(0, W17_CLASSES, W17_BATCH).astype(np.int64)
    return params + bufs + [w17_images(rng), y]


def w17_fwd_data(seed: int = 0) -> list:
    """Parameters, each BatchNorm's running mean and variance, images."""
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(1 + 2 * W17_BLOCKS):
        stats += [(0.1 * rng.standard_normal(W17_C)).astype(np.float32),
                  rng.uniform(0.5, 2.0, W17_C).astype(np.float32)]
    return w17_params(rng) + stats + [w17_images(rng)]


def w17_logits(F, params, x, stats=None):
    """The network on tracecomp and PyTorch (F is their nn.functional): BatchNorm on the
    batch's statistics without `stats`, else on stats (running mean, variance per BN)."""
    bns = iter(range(0, 2 * (1 + 2 * W17_BLOCKS), 2))

    def bn(h, w, b):
        if stats is None:
            return F.batch_norm(h, None, None, w, b, training=True)
        i = next(bns)
        return F.batch_norm(h, stats[i], stats[i + 1], w, b, training=False)
    h = F.relu(bn(F.conv2d(x, params[0], padding=1), params[1], params[2]))
    for i in range(3, 3 + 6 * W17_BLOCKS, 6):
        w1, g1, b1, w2, g2, b2 = params[i:i + 6]
        r = F.relu(bn(F.conv2d(h, w1, padding=1), g1, b1))
        h = F.relu(bn(F.conv2d(r, w2, padding=1), g2, b2) + h)
    h = F.adaptive_avg_pool2d(h, 1).reshape(x.shape[0], W17_C)
    return F.linear(h, params[-2], params[-1])


def w17_jax_logits(params, x, stats=None):
    import jax
    from jax import lax
    bns = iter(range(0, 2 * (1 + 2 * W17_BLOCKS), 2))

    def conv(h, w):
        return lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def bn(h, w, b):                # functional BatchNorm: biased variance, eps 1e-5
        if stats is None:
            mu = h.mean((0, 2, 3), keepdims=True)
            var = ((h - mu) ** 2).mean((0, 2, 3), keepdims=True)
        else:
            i = next(bns)
            mu, var = stats[i][:, None, None], stats[i + 1][:, None, None]
        return (h - mu) * lax.rsqrt(var + 1e-5) * w[:, None, None] + b[:, None, None]
    h = jax.nn.relu(bn(conv(x, params[0]), params[1], params[2]))
    for i in range(3, 3 + 6 * W17_BLOCKS, 6):
        w1, g1, b1, w2, g2, b2 = params[i:i + 6]
        r = jax.nn.relu(bn(conv(h, w1), g1, b1))
        h = jax.nn.relu(bn(conv(r, w2), g2, b2) + h)
    return h.mean((2, 3)) @ params[-2].T + params[-1]


def w17_losses() -> tuple:
    def tc_loss(params, x, y):
        import tracecomp.nn.functional as F
        return F.cross_entropy(w17_logits(F, params, x), y)

    def torch_loss(params, x, y):
        import torch.nn.functional as F
        return F.cross_entropy(w17_logits(F, params, x), y)

    def jax_loss(params, x, y):
        import jax
        import jax.numpy as jnp
        logp = jax.nn.log_softmax(w17_jax_logits(params, x), axis=1)
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()
    return tc_loss, torch_loss, jax_loss


def w17_inference() -> tuple:
    """The logits with running statistics: `params` is the parameters, then the statistics."""
    n = len(w17_shapes())

    def tc_fwd(params, x):
        import tracecomp.nn.functional as F
        return w17_logits(F, params[:n], x, params[n:])

    def torch_fwd(params, x):
        import torch.nn.functional as F
        return w17_logits(F, params[:n], x, params[n:])
    return tc_fwd, torch_fwd, lambda params, x: w17_jax_logits(params[:n], x, params[n:])


def sgd_momentum(params, grads, state) -> list:
    """PyTorch's SGD with momentum and weight decay: b = m b + (g + wd p), p - lr b;
    returns the new params, then the new buffers."""
    bufs = [W17_MOMENTUM * b + (g + W17_WD * p) for p, g, b in zip(params, grads, state)]
    return [p - LR * b for p, b in zip(params, bufs)] + bufs


def w17_flops() -> tuple[int, int]:
    """(forward, train step) conv and linear FLOPs; the step has no input gradient for the stem."""
    pixels = W17_BATCH * 32 * 32
    stem = 2 * pixels * W17_C * 3 * 9
    fwd = stem + 2 * W17_BLOCKS * 2 * pixels * W17_C * W17_C * 9 + 2 * W17_BATCH * W17_C * W17_CLASSES
    return fwd, 3 * fwd - stem


def w17_cases() -> list[Case]:
    if not installed("torch"):
        return []                   # the reference is PyTorch in float64
    n, nstats = len(w17_shapes()), 2 * (1 + 2 * W17_BLOCKS)
    fwd_flops, step_flops = w17_flops()
    title = f"ResNet-style CNN ({W17_C} ch, {W17_BLOCKS} residual blocks, BatchNorm), batch {W17_BATCH} of 3x32x32"
    return [Case("W17-step", "W17", f"{title}: train step (fwd, bwd, SGD momentum + wd) f32", w17_step_data,
                 layer_reference("step", w17_losses, n, 2 * n, sgd_momentum), W17_STEP_TOL,
                 layer_builders("step", w17_losses, n, 2 * n, sgd_momentum),
                 lambda bw, peak: step_flops / peak, w4_error, note=f"{step_flops / 1e9:.2f} GFLOP"),
            Case("W17-fwd", "W17", f"{title}: inference logits (running statistics) f32", w17_fwd_data,
                 layer_reference("fwd", w17_inference, n + nstats, n + nstats, None), 1e-4,
                 layer_builders("fwd", w17_inference, n + nstats, n + nstats, None),
                 lambda bw, peak: fwd_flops / peak, note=f"{fwd_flops / 1e9:.2f} GFLOP")]


# ----------------------------------------------------------------------------- W9, W10
# Not in DESIGN.md's list (W7 and W8 are issue 12's CNN and transformer steps): issue 13's
# new kernel families, measured so they have numbers beside NumPy's and PyTorch's.


def w9_cases() -> list[Case]:
    """A stable argsort of every row (the sort kernel family)."""
    rows, n = 1024, 4096

    def inputs():
        return [np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)]

    def np_fn(x):
        return np.argsort(x, -1, kind="stable")

    def tc_fn(x):
        import tracecomp as tc
        return tc.argsort(x, -1)

    def torch_fn(x):
        import torch
        return torch.argsort(x, stable=True, dim=-1)

    def jax_fn(x):
        import jax.numpy as jnp
        return jnp.argsort(x, axis=-1, stable=True)

    def mismatch(out, ref) -> float:
        return float(np.mean(as_numpy(out) != ref))

    return [Case("W9", "W9", f"stable argsort of {rows} rows of {n} f32", inputs,
                 lambda inputs: np_fn(inputs[0]), 0.0, standard(tc_fn, np_fn, torch_fn, jax_fn),
                 mem_floor(rows * n * (4 + 8)), mismatch, note="error: fraction of indices unlike NumPy's")]


def w10_cases() -> list[Case]:
    """Ten item assignments into a fresh 4M-element f32 vector (functionalized scatters,
    updated in the vector's memory once the old value is dead: donation.update_in_place)."""
    n, step = 1 << 22, 7

    def inputs():
        return [np.random.default_rng(0).standard_normal(n).astype(np.float32),
                np.arange(0, n - 16, step, dtype=np.int64)]

    def assign(x, i):           # NumPy, tracecomp and PyTorch spell it alike
        y = x * 2
        for k in range(10):
            y[i + k] = float(k)
        return y

    def jax_fn(x, i):
        y = x * 2
        for k in range(10):
            y = y.at[i + k].set(float(k))
        return y

    def reference(inputs):
        return assign(*inputs)
    writes = 10 * (n // step) * (8 + 4)             # each assignment: its indices and values
    return [Case("W10", "W10", f"10 item assignments y[i + k] = k into {n} f32, {n // step} indices each", inputs,
                 reference, 0.0, standard(assign, assign, assign, jax_fn), mem_floor(2 * n * 4 + writes))]


# ----------------------------------------------------------------------------- W11
# Issue 17's tc.vmap: per-example gradients of an MLP (vmap of grad, the parameters unmapped),
# against torch.func's and jax's, and NumPy written batched by hand.

W11_SIZES, W11_BATCH = (256, 256, 10), 64


def w11_data(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    d, h, c = W11_SIZES
    return [(rng.standard_normal((d, h)) * d ** -0.5).astype(np.float32), np.zeros(h, np.float32),
            (rng.standard_normal((h, c)) * h ** -0.5).astype(np.float32), np.zeros(c, np.float32),
            rng.standard_normal((W11_BATCH, d)).astype(np.float32),
            rng.integers(0, c, W11_BATCH).astype(np.int64)]


def w11_loss(lib, F):
    def loss(w1, b1, w2, b2, x, y):           # one example
        logits = lib.tanh(x @ w1 + b1) @ w2 + b2
        return F.cross_entropy(logits[None], y[None])
    return loss


def w11_numpy(w1, b1, w2, b2, x, y) -> list:
    """The per-example gradients, batched by hand (outer products per example)."""
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    dh = (p @ w2.T) * (1 - h * h)
    return [x[:, :, None] * dh[:, None, :], dh, h[:, :, None] * p[:, None, :], p]


def w11_cases() -> list[Case]:
    mapped = (None, None, None, None, 0, 0)

    def tc_fn(*args):
        import tracecomp as tc
        return tc.vmap(tc.grad(w11_loss(tc, tc.nn.functional), argnums=(0, 1, 2, 3)), in_axes=mapped)(*args)

    def torch_fn(*args):
        import torch
        loss = w11_loss(torch, torch.nn.functional)
        return torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2, 3)), in_dims=mapped)(*args)

    def jax_fn(*args):
        import jax
        import jax.numpy as jnp

        def loss(w1, b1, w2, b2, x, y):
            return -jax.nn.log_softmax(jnp.tanh(x @ w1 + b1) @ w2 + b2)[y]
        return jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)), in_axes=mapped)(*args)

    def reference(inputs):
        return w11_numpy(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs])
    d, h, c = W11_SIZES
    out_bytes = W11_BATCH * (d * h + h + h * c + c) * 4
    flops = 2 * W11_BATCH * (d * h + h * c) * 2 + W11_BATCH * (d * h + h * c)   # fwd, dh, outer products
    return [Case("W11", "W11", f"per-example gradients, MLP {d}-{h}-{c}, batch {W11_BATCH} f32 (vmap of grad)",
                 w11_data, reference, 1e-4, standard(tc_fn, w11_numpy, torch_fn, jax_fn),
                 lambda bw, peak: max(out_bytes / bw, flops / peak),
                 note=f"{out_bytes / 1e6:.1f} MB of gradients out")]


# ----------------------------------------------------------------------------- W8a

W8A_SHAPE = (64, 256, 64)        # batch x heads, sequence, head dim


def w8a_data():
    rng = np.random.default_rng(8)
    return [rng.standard_normal(W8A_SHAPE).astype(np.float32) for _ in range(4)]   # q, k, v, cotangent g


def w8a_numpy(q, k, v, g):
    """The loss sum(attention(q, k, v) * g) and its gradients in q, k, v, by hand."""
    scale = q.dtype.type(1 / np.sqrt(q.shape[-1]))
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    out = p @ v
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    return [(out * g).sum(), ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g]


def w8a_loss(softmax):
    def loss(q, k, v, g):
        s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]))
        return ((softmax(s) @ v) * g).sum()
    return loss


def w8a_cases() -> list[Case]:
    def tc_fn(q, k, v, g):
        import tracecomp as tc
        value, grads = tc.value_and_grad(w8a_loss(lambda s: tc.softmax(s, -1)), argnums=(0, 1, 2))(q, k, v, g)
        return [value, *grads]

    def jax_fn(q, k, v, g):
        import jax
        import jax.numpy as jnp

        def loss(q, k, v):
            s = (q @ jnp.swapaxes(k, -1, -2)) * (1 / math.sqrt(q.shape[-1]))
            return ((jax.nn.softmax(s, -1) @ v) * g).sum()
        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
        return [value, *grads]

    def reference(inputs):
        return w8a_numpy(*[a.astype(np.float64) for a in inputs])
    bh, t, d = W8A_SHAPE
    flops = 2 * bh * t * t * d * 6              # forward: 2 products; backward: 4
    impls = {"tracecomp": lambda inputs: build_tracecomp(tc_fn, inputs),
             "numpy": lambda inputs: build_numpy(w8a_numpy, inputs),
             "torch": lambda inputs: build_torch_grad(inputs, compiled=False),
             "torch.compile": lambda inputs: build_torch_grad(inputs, compiled=True),
             "jax.jit": lambda inputs: build_jax(jax_fn, inputs)}
    return [Case("W8a", "W8a", f"attention value_and_grad, B*H={bh}, T={t}, d={d} f32", w8a_data, reference, 1e-4,
                 impls, lambda bw, peak: flops / peak,
                 note="loss sum(softmax(q k^T / 8) v * g); its gradients in q, k, v (by hand in NumPy)")]


def build_torch_grad(inputs, compiled: bool):
    """W8a's value and gradients by autograd; `compiled`: the loss through torch.compile
    (AOTAutograd compiles its backward too)."""
    import torch
    q, k, v, g = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    loss = w8a_loss(lambda s: s.softmax(-1))
    f = torch.compile(loss) if compiled else loss

    def call():
        value = f(q, k, v, g)
        return [value.detach(), *torch.autograd.grad(value, (q, k, v))]
    return call


# ----------------------------------------------------------------------------- W12, W12c, W13
# Issue 35's loops.  W12: a one-layer LSTM's Adam train step; tracecomp as one tc.scan (a
# hand-written cell in the body) and with the Python loop unrolled into the graph, PyTorch's
# torch.nn.LSTM eager (oneDNN's RNN kernels), torch.compile of the hand-written Python loop
# and jax.lax.scan under jax.jit.  Every hand-written version projects the whole sequence's
# inputs in one matmul before the loop (as torch.nn.LSTM and tc.nn.LSTM do), so that the
# loop body is the recurrent matmul and the gates.  The reference is the step in NumPy
# float64, its backward written by hand (w12_numpy_step: checked against torch autograd in
# float64).  W12c: that step's first call in a fresh process with empty compile caches,
# against the sequence length.  W13: a data-dependent while loop, a batched Newton solve.

W12_BATCH, W12_IN, W12_HIDDEN, W12_CLASSES = 32, 64, 256, 10
W12_LENGTHS, W12_QUICK_LENGTHS = (100, 1000), (100,)
W12C_LENGTHS, W12C_QUICK_LENGTHS = (10, 100, 1000, 10000), (10, 1000)
W12_UNROLLED_MAX = 100           # the unrolled tracecomp step only up to this length
W12C_TORCH_COMPILE_MAX = 100     # torch.compile's cold first call only up to this length
W12_TORCH_COMPILE_LIMIT_S = 300.0    # a child of torch.compile's W12 step gets this long
W12_LR, W12_BETAS, W12_EPS = 1e-3, (0.9, 0.999), 1e-8
W12_STEP = 10                    # Adam's step count: moments as after 9 steps (see w12_data)
W12_GRAD_SCALE = (5e-4, 5e-5, 1e-3, 1e-3, 3e-3, 3e-2)     # about each gradient's size (T = 100)
W12_NPARAMS = 6                  # w_ih, w_hh, b_ih, b_hh (PyTorch's LSTM), w_out, b_out (head)
VARIANT_OF = {"tracecomp-unrolled": "tracecomp", "tracecomp-f32": "tracecomp",    # run beside its base
              "tracecomp-dynamic": "tracecomp"}                                     # implementation when selected


def w12_data(length: int, seed: int = 0) -> list:
    """Parameters (PyTorch's LSTM and Linear initialization, gates i, f, g, o), Adam's first
    and second moments as in a run in progress (the second bounded away from 0, so that the
    update is a smooth function of the gradient), the inputs (length, batch, features) and
    the labels.  The parameters and moments are the same at every length."""
    rng = np.random.default_rng(seed)
    h, i, c = W12_HIDDEN, W12_IN, W12_CLASSES
    shapes = [(4 * h, i), (4 * h, h), (4 * h,), (4 * h,), (c, h), (c,)]
    params = [rng.uniform(-h ** -0.5, h ** -0.5, s).astype(np.float32) for s in shapes]
    ms = [(g * rng.standard_normal(s)).astype(np.float32) for g, s in zip(W12_GRAD_SCALE, shapes)]
    vs = [(g * g * rng.uniform(0.5, 2.0, s)).astype(np.float32) for g, s in zip(W12_GRAD_SCALE, shapes)]
    data = np.random.default_rng(seed + length)
    x = data.standard_normal((length, W12_BATCH, i)).astype(np.float32)
    y = data.integers(0, c, W12_BATCH).astype(np.int64)
    return params + ms + vs + [x, y]


def w12_adam(params, grads, state) -> list:
    """One Adam step (PyTorch's defaults but lr: bias-corrected moments, no weight decay) as
    functional math on any library's arrays; returns the new params, first and second moments."""
    n = len(params)
    b1, b2 = W12_BETAS
    c1, c2 = 1 - b1 ** W12_STEP, 1 - b2 ** W12_STEP
    new_p, new_m, new_v = [], [], []
    for p, g, m, v in zip(params, grads, state[:n], state[n:]):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * (g * g)
        new_p.append(p - W12_LR * (m / c1) / ((v / c2) ** 0.5 + W12_EPS))
        new_m.append(m)
        new_v.append(v)
    return new_p + new_m + new_v


def w12_flops(length: int) -> int:
    """The step's matmul FLOPs: per step the recurrent matmul (2 B H 4H) and the input
    projection (2 B I 4H), times 3 for the forward and the backward (the backward's input
    gradient of the projection is not needed, so ~3 is a slight overcount); the head and
    the gates are left out (< 1%)."""
    b, i, h = W12_BATCH, W12_IN, W12_HIDDEN
    return 3 * (2 * b * h * 4 * h + 2 * b * i * 4 * h) * length


def w12_cell(sigmoid, tanh, w_hh_t):
    """The LSTM cell on a projected input row xp (x W_ih^T + b_ih + b_hh), for any library
    whose arrays have @, slicing and arithmetic."""
    h = W12_HIDDEN

    def cell(carry, xp):
        hid, c = carry
        g = xp + hid @ w_hh_t
        i, f, o = sigmoid(g[:, :h]), sigmoid(g[:, h:2 * h]), sigmoid(g[:, 3 * h:])
        c = f * c + i * tanh(g[:, 2 * h:3 * h])
        return (o * tanh(c), c), None
    return cell


def w12_project(x, w_ih, b):
    """The whole sequence's input projection, one matmul: (T, B, I) -> (T, B, 4H)."""
    t, bsz, i = x.shape
    return (x.reshape(t * bsz, i) @ w_ih.T + b).reshape(t, bsz, 4 * W12_HIDDEN)


def w12_tc_loss(unrolled: bool):
    def loss(params, x, y):
        import tracecomp as tc
        import tracecomp.nn.functional as F
        w_ih, w_hh, b_ih, b_hh, w_out, b_out = params
        xp = w12_project(x, w_ih, b_ih + b_hh)
        cell = w12_cell(tc.sigmoid, tc.tanh, w_hh.T)
        carry = (tc.zeros((x.shape[1], W12_HIDDEN)), tc.zeros((x.shape[1], W12_HIDDEN)))
        if unrolled:
            for t in range(x.shape[0]):
                carry, _ = cell(carry, xp[t])
        else:
            carry, _ = tc.scan(cell, carry, xp)
        return F.cross_entropy(F.linear(carry[0], w_out, b_out), y)
    return loss


def w12_torch_loop_loss(params, x, y):
    """The hand-written cell in a Python loop, in PyTorch (what torch.compile is given)."""
    import torch
    w_ih, w_hh, b_ih, b_hh, w_out, b_out = params
    xp = w12_project(x, w_ih, b_ih + b_hh)
    cell = w12_cell(torch.sigmoid, torch.tanh, w_hh.T)
    carry = (x.new_zeros(x.shape[1], W12_HIDDEN), x.new_zeros(x.shape[1], W12_HIDDEN))
    for t in range(x.shape[0]):
        carry, _ = cell(carry, xp[t])
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(carry[0], w_out, b_out), y)


@functools.cache
def w12_torch_module():
    import torch
    return torch.nn.LSTM(W12_IN, W12_HIDDEN)


def w12_torch_lstm_loss(params, x, y):
    """torch.nn.LSTM (its own parameters swapped for these by torch.func.functional_call):
    on CPU in float32 its forward and backward are oneDNN's RNN primitives."""
    import torch
    w_ih, w_hh, b_ih, b_hh, w_out, b_out = params
    names = {"weight_ih_l0": w_ih, "weight_hh_l0": w_hh, "bias_ih_l0": b_ih, "bias_hh_l0": b_hh}
    out, _ = torch.func.functional_call(w12_torch_module(), names, (x,))
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(out[-1], w_out, b_out), y)


def w12_jax_loss(params, x, y):
    import jax
    import jax.numpy as jnp
    w_ih, w_hh, b_ih, b_hh, w_out, b_out = params
    xp = w12_project(x, w_ih, b_ih + b_hh)
    cell = w12_cell(jax.nn.sigmoid, jnp.tanh, w_hh.T)
    zeros = jnp.zeros((x.shape[1], W12_HIDDEN), x.dtype)
    (h, _), _ = jax.lax.scan(cell, (zeros, zeros), xp)
    logp = jax.nn.log_softmax(h @ w_out.T + b_out, axis=1)
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


def w12_numpy_step(state: list, x: np.ndarray, y: np.ndarray) -> list:
    """The train step in NumPy, its backward through time by hand, in the dtype of its inputs
    (float64: the reference).  Keeps h and c of every step and recomputes the gates in the
    backward pass (at T = 10,000 the gates of every step would be 2.6 GB in float64)."""
    n = W12_NPARAMS
    w_ih, w_hh, b_ih, b_hh, w_out, b_out = state[:n]
    t_len, bsz, _ = x.shape
    hd = W12_HIDDEN
    b = b_ih + b_hh
    sig = lambda v: 1 / (1 + np.exp(-v))      # noqa: E731

    def gates(t, h_prev):
        a = x[t] @ w_ih.T + b + h_prev @ w_hh.T
        return sig(a[:, :hd]), sig(a[:, hd:2 * hd]), np.tanh(a[:, 2 * hd:3 * hd]), sig(a[:, 3 * hd:])
    hs = np.zeros((t_len + 1, bsz, hd), x.dtype)
    cs = np.zeros((t_len + 1, bsz, hd), x.dtype)
    for t in range(t_len):
        i, f, g, o = gates(t, hs[t])
        cs[t + 1] = f * cs[t] + i * g
        hs[t + 1] = o * np.tanh(cs[t + 1])
    logits = hs[-1] @ w_out.T + b_out
    s = logits - logits.max(1, keepdims=True)
    e = np.exp(s)
    rows = np.arange(bsz)
    loss = -(s[rows, y] - np.log(e.sum(1))).mean()
    d = e / e.sum(1, keepdims=True)
    d[rows, y] -= 1
    d /= bsz
    g_out, gb_out = d.T @ hs[-1], d.sum(0)
    dh, dc = d @ w_out, np.zeros((bsz, hd), x.dtype)
    g_ih, g_hh, gb = np.zeros_like(w_ih), np.zeros_like(w_hh), np.zeros_like(b)
    for t in range(t_len - 1, -1, -1):
        i, f, g, o = gates(t, hs[t])
        tc_ = np.tanh(cs[t + 1])
        dc = dc + dh * o * (1 - tc_ * tc_)
        da = np.concatenate([dc * g * i * (1 - i), dc * cs[t] * f * (1 - f), dc * i * (1 - g * g),
                             dh * tc_ * o * (1 - o)], axis=1)
        g_ih += da.T @ x[t]
        g_hh += da.T @ hs[t]
        gb += da.sum(0)
        dh, dc = da @ w_hh, dc * f
    grads = [g_ih, g_hh, gb, gb, g_out, gb_out]
    return [loss] + w12_adam(list(state[:n]), grads, list(state[n:3 * n]))


def w12_reference(inputs):
    """w12_numpy_step in float64 (with threadpoolctl, if installed, on one BLAS thread: its
    matmuls are small, and OpenBLAS's threads wait on each other on a loaded machine)."""
    n = 3 * W12_NPARAMS
    try:
        from threadpoolctl import threadpool_limits
        limit = threadpool_limits(1, "blas")
    except ImportError:
        limit = contextlib.nullcontext()
    with limit:
        return (w12_numpy_step([a.astype(np.float64) for a in inputs[:n]], inputs[n].astype(np.float64),
                               inputs[n + 1]), inputs[:n])


def w12_builders(length: int, cold: bool = False, quick: bool = False) -> dict:
    """tracecomp (tc.scan), tracecomp-unrolled (the Python loop in the graph), torch
    (torch.nn.LSTM eager), torch.compile (the hand-written loop) and jax.jit (lax.scan).
    `cold` (W12c): tracecomp's two, and torch.compile's up to W12C_TORCH_COMPILE_MAX.
    `quick`: no torch.compile (its compile of the unrolled loop takes 40 s at T = 10)."""
    n, ns = W12_NPARAMS, 3 * W12_NPARAMS
    scan_b = layer_builders("step", lambda: (w12_tc_loss(False), w12_torch_loop_loss, w12_jax_loss), n, ns, w12_adam)
    other_b = layer_builders("step", lambda: (w12_tc_loss(True), w12_torch_lstm_loss, None), n, ns, w12_adam)
    impls = {"tracecomp": scan_b["tracecomp"]}
    if length <= W12_UNROLLED_MAX:
        impls["tracecomp-unrolled"] = other_b["tracecomp"]
    if not cold:
        impls.update({"torch": other_b["torch"], "torch.compile": scan_b["torch.compile"],
                      "jax.jit": scan_b["jax.jit"]})
    elif length <= W12C_TORCH_COMPILE_MAX:
        impls["torch.compile"] = scan_b["torch.compile"]
    if quick:
        impls.pop("torch.compile", None)
    return impls


def w12_cases(quick: bool = False) -> list[Case]:
    cases = []
    b, i, h = W12_BATCH, W12_IN, W12_HIDDEN
    for t in (W12_QUICK_LENGTHS if quick else W12_LENGTHS):
        flops = w12_flops(t)
        cases.append(Case(f"W12-T{t}", "W12", f"LSTM train step, T={t}, B={b}, {i}->{h}, head 10, Adam f32",
                          functools.partial(w12_data, t), w12_reference, 1e-3, w12_builders(t, quick=quick),
                          lambda bw, peak, flops=flops: flops / peak, w4_error,
                          note=f"{flops / 1e9:.2f} GFLOP; tracecomp: tc.scan of a hand-written cell",
                          timeouts={"torch.compile": W12_TORCH_COMPILE_LIMIT_S}))
    for t in (W12C_QUICK_LENGTHS if quick else W12C_LENGTHS):
        cases.append(Case(f"W12c-T{t}", "W12c", f"LSTM train step's first call, T={t}",
                          functools.partial(w12_data, t), w12_reference, 1e-3, w12_builders(t, cold=True, quick=quick),
                          error=w4_error, timeouts={"torch.compile": W12_TORCH_COMPILE_LIMIT_S},
                          second_call=True))
    return cases


W13_SIZES, W13_QUICK_SIZES = (4096, 1 << 20), (4096,)
W13_TOL, W13_MAX_ITERS = 1e-12, 100


def w13_data(n: int) -> list:
    """a in [0.5, 2] (so x^3 + a x - b is increasing: one real root), b in [-10, 10], float64."""
    rng = np.random.default_rng(13)
    return [rng.uniform(0.5, 2.0, n), rng.uniform(-10.0, 10.0, n)]


def w13_numpy(a, b):
    """Newton's method for x^3 + a x - b = 0 from x = 0, every row at once, until
    max |f(x)| < W13_TOL (at most W13_MAX_ITERS steps): the root and the step count."""
    x, k = np.zeros_like(b), 0
    while np.max(np.abs(x * x * x + a * x - b)) >= W13_TOL and k < W13_MAX_ITERS:
        x = x - (x * x * x + a * x - b) / (3 * x * x + a)
        k += 1
    return [x, np.int64(k)]


def w13_torch(a, b):
    """The same loop in PyTorch eager: a Python loop, as NumPy's."""
    import torch
    x, k = torch.zeros_like(b), 0
    while bool(torch.max(torch.abs(x * x * x + a * x - b)) >= W13_TOL) and k < W13_MAX_ITERS:
        x = x - (x * x * x + a * x - b) / (3 * x * x + a)
        k += 1
    return [x, torch.tensor(k)]


def w13_loop(m, a, b):
    """The loop's condition and body on the carry (x, k), in the array namespace `m`
    (tracecomp or jax.numpy): the peers that have a while-loop primitive."""
    def cond(s):
        x, k = s
        return (m.max(m.abs(x * x * x + a * x - b)) >= W13_TOL) & (k < W13_MAX_ITERS)

    def body(s):
        x, k = s
        return x - (x * x * x + a * x - b) / (3 * x * x + a), k + 1
    return cond, body


def w13_tc(a, b):
    import tracecomp as tc
    x, k = tc.while_loop(*w13_loop(tc, a, b), (tc.zeros_like(b), tc.tensor(0)))
    return [x, k]


def w13_jax(a, b):
    import jax
    import jax.numpy as jnp
    return list(jax.lax.while_loop(*w13_loop(jnp, a, b), (jnp.zeros_like(b), jnp.asarray(0))))


def w13_build_jax(inputs):
    import jax
    jax.config.update("jax_enable_x64", True)     # float64 arrays (a child of its own: no other case sees it)
    return build_jax(w13_jax, inputs)


def w13_reference(inputs):
    """The real root by Cardano's formula (float64; one Newton step polishes its rounding)
    and NumPy's step count."""
    a, b = inputs
    s = np.sqrt(b * b / 4 + a ** 3 / 27)
    x = np.cbrt(b / 2 + s) + np.cbrt(b / 2 - s)
    x = x - (x * x * x + a * x - b) / (3 * x * x + a)
    return [x, w13_numpy(a, b)[1]]


def w13_error(out, ref) -> float:
    """The root's max |x - ref| / max |ref|; inf when the step count is off by more than one
    from NumPy's (the same loop in float64: only rounding may move the last test)."""
    if len(out) != 2 or abs(int(np.asarray(out[1])) - int(ref[1])) > 1:
        return math.inf
    return rel_error(out[0], ref[0])


def w13_cases(quick: bool = False) -> list[Case]:
    cases = []
    for n in (W13_QUICK_SIZES if quick else W13_SIZES):
        impls = standard(w13_tc, w13_numpy, w13_torch, None)
        impls["jax.jit"] = w13_build_jax
        del impls["torch.compile"]
        # one pass over a and b, x written once; every step after the first works in cache (n = 4096)
        cases.append(Case(f"W13-{n}", "W13", f"while loop: batched Newton for x^3 + a x = b, {n} f64, to |f| < 1e-12",
                          functools.partial(w13_data, n), w13_reference, 1e-10, impls,
                          mem_floor(3 * n * 8), w13_error,
                          note="Newton steps from x = 0, as many as NumPy's (checked); "
                               "floor: a, b read and x written once"))
    return cases


# ----------------------------------------------------------------------------- W4b, W8b
# (issue 37) W4's and W8's train steps with the loss under bfloat16 autocast: tc.autocast
# against torch.autocast("cpu") eager and torch.compile, and tracecomp's own float32 step
# ("tracecomp-f32").  Parameters, gradients and the update stay float32, as autocast
# leaves them; the reference is W4's / W8's float64 one, with a bfloat16-sized tolerance.


def w4b_cases() -> list[Case]:
    w4 = w4_cases()[0]

    def b_tracecomp(inputs):
        f = w4_tracecomp_step(bf16=True)
        args = [aligned(v) for v in inputs]
        return lambda: f(*args)

    def b_torch(compiled):
        def build(inputs):
            import torch
            step = w4_torch_step(torch, compiled, bf16=True)
            args = [torch.from_numpy(v) for v in inputs]
            return lambda: step(*args)
        return build
    impls = {"tracecomp": b_tracecomp, "tracecomp-f32": w4.impls["tracecomp"], "torch": b_torch(False),
             "torch.compile": b_torch(True)}
    return [dataclasses.replace(w4, key="W4b", workload="W4b", title=w4.title.replace("f32", "bf16 autocast"),
                                tol=W_BF16_TOL, impls=impls)]


W_BF16_TOL = 0.3             # max |new - ref_new| / max update: bfloat16 products in the gradients (torch: 0.15)


def autocast_losses(losses: Callable) -> Callable:
    """`losses()` (tracecomp's, PyTorch's, jax's) with the first two under bfloat16 autocast."""
    def wrapped():
        import torch
        import tracecomp as tc
        tc_loss, torch_loss, _ = losses()
        return tc.autocast(tc.bfloat16)(tc_loss), torch.autocast("cpu", torch.bfloat16)(torch_loss), None
    return wrapped


def w8b_cases() -> list[Case]:
    if not installed("torch"):
        return []
    w8 = next(c for c in w8_cases() if c.key == "W8-step")
    n = len(w8_shapes())
    impls = layer_builders("step", autocast_losses(w8_losses), n, 3 * n, adamw)
    del impls["jax.jit"]
    impls["tracecomp-f32"] = w8.impls["tracecomp"]
    return [dataclasses.replace(w8, key="W8b", workload="W8b", title=w8.title.replace("f32", "bf16 autocast"),
                                tol=W_BF16_TOL, impls=impls)]


def all_cases(quick: bool = False) -> dict[str, Case]:
    cases = w1_cases() + w2_cases() + w3_cases((1024,) if quick else (1024, 4096)) \
        + w3b_cases((1024,) if quick else (1024, 4096)) + w4_cases() + w6_cases() \
        + w7_cases() + w8_cases() + w8a_cases() + w9_cases() + w10_cases() + w11_cases() + w12_cases(quick) \
        + w13_cases(quick) + w15_cases() + w4b_cases() + w8b_cases() + w14_cases() + w17_cases()
    for case in cases:
        if case.workload in DYNAMIC_VARIANT_OF and "tracecomp" in case.impls:
            case.impls["tracecomp-dynamic"] = dynamic_variant(case.impls["tracecomp"])
    return {c.key: c for c in cases}


# (issue 36) W1, W2, W4, W8 and W9 also as "tracecomp-dynamic": every tc.trace the builder makes
# takes dynamic=True (every dim of every argument a size known at run time), to compare a
# dynamic compile's speed with the static one's.
DYNAMIC_VARIANT_OF = ("W1", "W2", "W4", "W8", "W9")


def dynamic_variant(build: Callable) -> Callable:
    def build_dynamic(inputs):
        import tracecomp as tc
        trace = tc.trace
        tc.trace = functools.partial(trace, dynamic=True)
        try:
            return build(inputs)
        finally:
            tc.trace = trace
    return build_dynamic


# ----------------------------------------------------------------------------- machine


def copy_bandwidth(nbytes: int = 256 << 20, repeat: int = 15) -> dict:
    """Copy bandwidth, bytes read + written per second: np.copyto on one thread, and on all
    cores over equal parts (np.copyto releases the GIL).  Destination pre-faulted; 256 MiB
    arrays (far past the L3).  The best of `repeat` copies is the floor's bandwidth (the
    machine can do that much); the median is reported too."""
    n = nbytes // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    np.copyto(dst, src)

    def one():
        np.copyto(dst, src)

    nthreads = os.cpu_count() or 1
    chunks = [(i * n // nthreads, (i + 1) * n // nthreads) for i in range(nthreads)]

    def many():
        ts = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b])) for a, b in chunks]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    result: dict[str, Any] = {}
    for name, fn in (("1 thread", one), (f"{nthreads} threads", many)):
        times = [time_rep(fn, 1) for _ in range(repeat)]
        result[name] = {"best_GBps": 2 * nbytes / min(times) / 1e9,
                        "median_GBps": 2 * nbytes / statistics.median(times) / 1e9}
    result["best_GBps"] = max(v["best_GBps"] for v in result.values())
    result["array_MiB"] = nbytes >> 20
    return result


FMA_ACCUMULATORS = 12      # independent FMA chains: > latency (4) x pipes (2)


def _fma_kernel(avx512: bool):
    """A JIT-compiled loop of FMAs on registers only (inline assembly, so LLVM cannot fold
    it): `fma_loop(n)` runs n x FMA_ACCUMULATORS vfmadd231ps on 16 (or 8) fp32 lanes."""
    import ctypes
    import llvmlite.ir as ir
    from tracecomp.runtime.jit import compile_module
    reg = "zmm" if avx512 else "ymm"
    m = ir.Module("bench_fma")
    i64 = ir.IntType(64)
    fn = ir.Function(m, ir.FunctionType(i64, [i64]), "fma_loop")
    b = ir.IRBuilder(fn.append_basic_block())
    nregs = FMA_ACCUMULATORS + 2
    zero = "".join(f"vxorps %{reg}{k}, %{reg}{k}, %{reg}{k}\n" for k in range(nregs))   # no denormals
    body = "".join(f"vfmadd231ps %{reg}0, %{reg}1, %{reg}{k + 2}\n" for k in range(FMA_ACCUMULATORS))
    clobbers = ",".join(f"~{{{reg}{k}}}" for k in range(nregs)) + ",~{cc}"
    asm = ir.InlineAsm(ir.FunctionType(i64, [i64]), zero + "1:\n" + body + "dec $0\njnz 1b",
                       "=r,0," + clobbers, side_effect=True)
    b.ret(b.call(asm, [fn.args[0]]))
    lib = compile_module(m)
    f = lib.function("fma_loop", ctypes.c_int64, ctypes.c_int64)
    return f


def peak_flops(facts: dict, reps: int = 40) -> dict:
    """The fp32 peak used as the matmul floor: measured, not assumed.  An FMA-only loop
    (`_fma_kernel`) on one thread gives the per-core rate; the peak is cores x that (each
    core alone, so load from other processes during the test does not lower it).  Best of
    `reps` short runs.  Also reported: the same loop on all cores at once, the clock this
    implies (rate / (2 FMA pipes x lanes x 2 flops)), the figure at the base clock of
    /proc/cpuinfo, and the float32 matmul rate NumPy's BLAS reaches (4096^3)."""
    cores, ghz = facts.get("cores", 1), facts.get("mhz", 0) / 1e3
    avx512 = bool(facts.get("avx512f"))
    lanes = 16 if avx512 else 8
    per_cycle = 2 * lanes * 2
    out: dict[str, Any] = {"base_clock_formula": f"{cores} cores x {ghz:.3f} GHz x 2 FMA pipes x {lanes} lanes x 2",
                           "base_clock": cores * ghz * per_cycle * 1e9}
    try:
        f = _fma_kernel(avx512)
        n = 2_000_000
        f(1000)
        flops_per_call = n * FMA_ACCUMULATORS * lanes * 2
        for threads in sorted({1, cores}):
            best = 0.0
            for _ in range(reps):
                ts = [threading.Thread(target=f, args=(n,)) for _ in range(threads)]
                t0 = time.perf_counter()
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                best = max(best, threads * flops_per_call / (time.perf_counter() - t0))
            out[f"fma_loop_{threads}_thread"] = best
        out["clock_GHz"] = out["fma_loop_1_thread"] / per_cycle / 1e9
        out["peak"] = cores * out["fma_loop_1_thread"]
        out["formula"] = (f"{cores} cores x {out['fma_loop_1_thread'] / 1e9:.0f} GFLOP/s measured on one core "
                          f"(FMA loop; = {out['clock_GHz']:.2f} GHz x 2 FMA pipes x {lanes} fp32 lanes x 2)")
    except Exception as e:      # no JIT or no such instructions: the base-clock figure
        out["peak"] = out["base_clock"]
        out["formula"] = out["base_clock_formula"] + f" (FMA loop failed: {e})"
    n = 4096
    a = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    a @ a
    out["sgemm_4096_numpy"] = max(2 * n ** 3 / time_rep(lambda: a @ a, 1) for _ in range(3))
    return out




class CpuMeter:
    """How much of the machine's CPU time other processes took during an interval: busy
    time in /proc/stat minus this process's and its children's CPU time."""

    def __init__(self):
        self.ncpu = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _busy(self) -> float:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return math.nan
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return (sum(v[:8]) - idle) / self.tick

    def _ours(self) -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        self.t0, self.b0, self.o0 = time.perf_counter(), self._busy(), self._ours()

    def others(self) -> float:
        wall = time.perf_counter() - self.t0
        other = (self._busy() - self.b0) - (self._ours() - self.o0)
        return max(0.0, other / (wall * self.ncpu)) if wall > 0 else math.nan


def machine_facts() -> dict:
    facts: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                             "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and "cpu" not in facts:
                    facts["cpu"] = line.split(":", 1)[1].strip()
                if line.startswith("cpu MHz") and "mhz" not in facts:
                    facts["mhz"] = float(line.split(":", 1)[1])
                if line.startswith("flags") and "avx512f" not in facts:
                    flags = line.split(":", 1)[1].split()
                    facts["avx512f"] = "avx512f" in flags
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("CPU family", "Model", "L2 cache", "L3 cache", "Hypervisor vendor"):
                facts["lscpu " + k.strip()] = v.strip()
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            facts["memory_GiB"] = round(int(f.readline().split()[1]) / 2 ** 20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import threadpoolctl
        facts["blas"] = [{k: d.get(k) for k in ("internal_api", "version", "architecture",
                                                 "num_threads", "threading_layer")}
                         for d in threadpoolctl.threadpool_info()]
    except ImportError:
        facts["blas"] = "threadpoolctl not installed (see np.show_config())"
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"):
        facts[var] = os.environ.get(var, "(unset)")
    for dist in ("llvmlite", "torch", "jax", "jaxlib", "threadpoolctl"):
        facts[dist] = version(dist)
    try:
        import llvmlite.binding as llvm
        facts["llvm"] = ".".join(map(str, llvm.llvm_version_info))
    except Exception:
        pass
    spec = importlib.util.find_spec("tracecomp")
    where = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else HERE
    facts["tracecomp_path"] = where
    try:
        facts["tracecomp_git"] = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=where,
                                                capture_output=True, text=True).stdout.strip() \
            or os.environ.get("BENCH_TRACECOMP_REV", "not a git checkout")
    except OSError:
        pass
    facts["loadavg_at_start"] = os.getloadavg()
    return facts


# ----------------------------------------------------------------------------- running


def prepare(row: Row, case: Case, impl: str, inputs: list, ref, progress: Optional[Callable[[str], None]] = None):
    """Build, first call (timed), check.  Returns the call, or None (row says why).
    `progress(what)` is told when the call is built and when its first call returned."""
    progress = progress or (lambda what: None)
    try:
        if case.check_impls:
            row.error = float(case.error(as_numpy(case.check_impls[impl](inputs)()), ref))
        call = case.impls[impl](inputs)
        progress("built")
        t0 = time.perf_counter()
        result = call()
        row.first_call_s = time.perf_counter() - t0
        progress(f"first call returned after {row.first_call_s:.1f} s")
        error = float(case.error(as_numpy(result), ref))      # inf on a wrong shape or a non-finite value
        if case.check_impls:
            row.extra["timed_variant_error"] = error            # dropout's own, not a fault
            row.error = row.error if math.isfinite(error) else math.inf
        else:
            row.error = error
        del result
        if not row.error <= case.tol:
            row.status, row.note = "WRONG", f"error {row.error:.3g} > tolerance {case.tol:g}; not timed"
            return None
        row.reps, row.calls_per_rep = calibrate(call, row.reps, case.before_each)
        return call
    except Exception as e:       # an implementation that fails gets a row saying why
        row.status, row.note = "error", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        if os.environ.get("BENCH_DEBUG"):
            traceback.print_exc()
        return None


def finish(row: Row, times: list[float]) -> None:
    row.median_s = statistics.median(times)
    row.min_s, row.max_s = min(times), max(times)
    row.extra["times_s"] = times


def time_interleaved(live: list[tuple[Row, Callable]], before: Optional[Callable[[], Any]] = None) -> None:
    """Round k times repetition k of each implementation in turn (`before` untimed before
    each call: Case.before_each)."""
    times: list[list[float]] = [[] for _ in live]
    gc.collect()
    gc.disable()
    try:
        for k in range(max((r.reps for r, _ in live), default=0)):
            for (row, call), ts in zip(live, times):
                if k < row.reps:
                    ts.append(time_rep(call, row.calls_per_rep, before))
    finally:
        gc.enable()
    for (row, _), ts in zip(live, times):
        finish(row, ts)


def new_row(case: Case, impl: str, repeat: int) -> Row:
    return Row(case.workload, case.title, impl, reps=repeat)


def run_in_process(case: Case, impls: list[str], inputs: list, ref, repeat: int) -> list[Row]:
    rows, live = [], []
    for impl in impls:
        row = new_row(case, impl, repeat)
        if case.env:
            row.note = f"in-process: its environment {case.env} was not applied"
        rows.append(row)
        call = prepare(row, case, impl, inputs, ref)
        if call is not None:
            live.append((row, call))
    time_interleaved(live, case.before_each)
    return rows


def pin_threads() -> None:
    """With --threads N, a child process runs on N CPUs only: the thread-count variables
    limit OpenMP, BLAS and torch, but not every runtime (jax's XLA CPU client keeps its own
    pool), and an affinity mask limits them all."""
    n = int(os.environ.get("BENCH_THREADS") or 0)
    if n and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:n])


RUNTIME_MODULE = {"tracecomp": "tracecomp", "numpy": "numpy", "torch": "torch", "torch.compile": "torch",
                  "jax.jit": "jax", "tracecomp-unrolled": "tracecomp"}


def first_call(row: Row, case: Case, impl: str, inputs: list, ref) -> Callable:
    """The first call of a fresh process (build + trace + compile + run), the runtime's
    import timed apart; tracecomp's compile stages (Lowered.timings) in row.extra.  Returns
    the call."""
    t0 = time.perf_counter()
    importlib.import_module(RUNTIME_MODULE[VARIANT_OF.get(impl, impl)])
    row.extra["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    call = case.impls[impl](inputs)
    result = as_numpy(call())
    row.first_call_s = row.median_s = row.min_s = row.max_s = time.perf_counter() - t0
    row.reps = row.calls_per_rep = 1
    if hasattr(call, "traced"):
        import tracecomp as tc
        row.extra["stages"] = call.traced.lower(*call.args).timings
        row.extra["cache"] = "hit" if tc.compile_cache.stats.hits else "miss"
    row.error = float(case.error(result, ref))
    if not row.error <= case.tol:
        row.status, row.note = "WRONG", f"error {row.error:.3g} > tolerance {case.tol:g}"
    return call


def child_main(key: str, impl: str, data: str, repeat: int, quick: bool, cold: bool = False) -> int:
    """A child process: one implementation of one case (or, `cold`, its first call only);
    prints its Row as JSON."""
    import pickle
    pin_threads()
    case = all_cases(quick)[key]
    with open(data, "rb") as f:
        inputs, ref = pickle.load(f)
    row = new_row(case, impl, repeat)
    if cold:
        try:
            call = first_call(row, case, impl, inputs, ref)
            if case.second_call:        # the same call again: its run alone, nothing left to compile
                t0 = time.perf_counter()
                as_numpy(call())
                row.extra["second_call_s"] = time.perf_counter() - t0
        except Exception as e:
            row.status, row.note = "error", f"{type(e).__name__}: {str(e)[:200]}"
        print("BENCHROW " + json.dumps(asdict(row)), flush=True)
        return 0
    call = prepare(row, case, impl, inputs, ref, lambda what: print("BENCHSTAGE " + what, flush=True))
    if call is not None:
        time_interleaved([(row, call)], case.before_each)
    print("BENCHROW " + json.dumps(asdict(row)), flush=True)
    return 0


def run_in_children(case: Case, impls: list[str], inputs: list, ref, args, cold: bool = False) -> list[Row]:
    """Each implementation in a child process of its own; `cold`: its first call only, with
    empty compile caches (tracecomp's, inductor's; jax keeps none unless told to)."""
    import pickle
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        data = os.path.join(tmp, "data.pkl")
        with open(data, "wb") as f:
            pickle.dump((inputs, ref), f, protocol=pickle.HIGHEST_PROTOCOL)
        for k, impl in enumerate(impls):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", case.key, impl, "--data", data,
                   "--repeat", str(args.repeat)] + (["--quick"] if args.quick else []) + (["--cold"] if cold else [])
            cache = os.path.join(tmp, f"cache{k}")
            if cold:
                seed_tuning(os.path.join(cache, "tracecomp"))
            env = dict(os.environ, **(case.env or {}), **({"TRACECOMP_CACHE_DIR": os.path.join(cache, "tracecomp"),
                                       "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
                                       "TRITON_CACHE_DIR": os.path.join(cache, "triton")} if cold else {}))
            timeout = (case.timeouts or {}).get(impl, CHILD_TIMEOUT_S)
            try:
                rows.append(Row(**child_result(cmd, "BENCHROW", env, timeout)))
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                stages = [x[len("BENCHSTAGE "):] for x in out.splitlines() if x.startswith("BENCHSTAGE ")]
                row = new_row(case, impl, args.repeat)
                row.status, row.note = "timed out", (f"its child process was stopped after {timeout:.0f} s; it had "
                                                     + ("; ".join(stages) if stages else "not built its call yet"))
                rows.append(row)
            except Exception as e:
                row = new_row(case, impl, args.repeat)
                row.status, row.note = "error", f"{type(e).__name__}: {e}"
                rows.append(row)
    return rows


def child_result(cmd: list[str], tag: str, env: dict, timeout: float) -> dict:
    """The JSON a child process prints after `tag` on a line of its own; RuntimeError with
    the last line of its stderr when it prints none (TimeoutExpired passes through)."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    line = next((x for x in p.stdout.splitlines() if x.startswith(tag + " ")), None)
    if line is None:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"child exited {p.returncode}: {tail[:200]}")
    return json.loads(line[len(tag) + 1:])


def print_row(row: Row) -> None:
    head = f"  {row.case[:34]:<34} {row.impl:<14}"
    if row.status != "ok" or row.median_s is None:
        print(f"{head} {row.status}: {row.note}", flush=True)
        return
    print(f"{head} {fmt_time(row.median_s):>10}  (min {fmt_time(row.min_s)}, max {fmt_time(row.max_s)}, "
          f"{row.reps}x{row.calls_per_rep}; first call {fmt_time(row.first_call_s)}"
          + (f"; err {row.error:.1e})" if row.error is not None else ")"), flush=True)


def run_case(case: Case, impls: list[str], args, bw: float, peak: float, skip: dict | None = None) -> list[Row]:
    inputs = case.inputs()
    ref = case.reference(inputs)
    skip = dict(skip or {}, **{i: "no implementation of this case" for i in impls if i not in case.impls})
    todo = [i for i in impls if i not in skip]
    if args.in_process:
        done = run_in_process(case, todo, inputs, ref, args.repeat)
    else:
        done = run_in_children(case, todo, inputs, ref, args)
    by_impl = {r.impl: r for r in done}
    rows = []
    for impl in impls:
        row = by_impl.get(impl)
        if row is None:
            row = new_row(case, impl, 0)
            row.reps = 0
            row.status, row.note = "skipped", skip[impl]
        row.floor_s = case.floor(bw, peak)
        if case.note:
            row.extra["case_note"] = case.note
        rows.append(row)
        print_row(row)
    return rows


COLD_RUNS = {"tracecomp": 3, "tracecomp-unrolled": 3}   # fresh processes per implementation (the others: 1, slow)


def cold_rows(case: Case, impls: list[str], args) -> list[Row]:
    """The first call of a case in a fresh process with empty compile caches (W8's step:
    trace + autodiff + compile + run, the import timed apart): median over COLD_RUNS."""
    inputs = case.inputs()
    ref = case.reference(inputs)
    rows = []
    for impl in (i for i in impls if i in case.impls):
        runs = [r for _ in range(COLD_RUNS.get(impl, 1)) for r in run_in_children(case, [impl], inputs, ref, args, cold=True)]
        ok = [r for r in runs if r.first_call_s is not None]
        row = runs[0] if not ok else sorted(ok, key=lambda r: r.first_call_s)[len(ok) // 2]
        row.case = f"first call, cold, in a fresh process: {case.title}"
        if ok:
            row.min_s, row.max_s = min(r.first_call_s for r in ok), max(r.first_call_s for r in ok)
            row.reps = len(ok)
        if any(r.status != "ok" for r in runs):
            row.status, row.note = next((r.status, r.note) for r in runs if r.status != "ok")
        stages = row.extra.get("stages")
        row.note = (row.note + "; " if row.note else "") + f"import {fmt_time(row.extra.get('import_s'))} apart" \
            + (": " + ", ".join(f"{k} {fmt_time(v)}" for k, v in stages.items() if v >= 5e-3) if stages else "")
        rows.append(row)
        print(f"  {'first call, cold':<34} {impl:<14} {fmt_time(row.first_call_s)} ({fmt_time(row.min_s)} - "
              f"{fmt_time(row.max_s)}; import {fmt_time(row.extra.get('import_s'))}; err {row.error}) "
              + (", ".join(f"{k} {fmt_time(v)}" for k, v in stages.items()) if stages else "")
              + (f" {row.status}: {row.note}" if row.status != "ok" else ""), flush=True)
    return rows


def with_variants(case: Case, impls: list[str]) -> list[str]:
    """`impls` and the case's variants (VARIANT_OF: W12's tracecomp-unrolled) whose base
    implementation is among them, each right after its base."""
    out = []
    for impl in impls:
        out.append(impl)
        out += [v for v, base in VARIANT_OF.items() if base == impl and v in case.impls]
    return out


def w12c(cases: dict, impls: list[str], args) -> list[Row]:
    """W12c: the first call of W12's step in fresh processes with empty compile caches, at
    each length (cold_rows), and a second call in the same process (its run alone)."""
    rows = []
    for case in (c for c in cases.values() if c.workload == "W12c"):
        for row in cold_rows(case, with_variants(case, impls), args):
            row.case = case.title
            second = row.extra.get("second_call_s")
            if second is not None:
                print(f"  {'':<34} {row.impl:<14} second call {fmt_time(second)}; first - second "
                      f"{fmt_time(row.first_call_s - second)}", flush=True)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- W16
# (issue 36) Greedy generation with a growing sequence, compiles included: generation.py
# runs each implementation in a process of its own with no on-disk compile caches.  A row's
# time is the cost per token once compiled; its first call is the whole generation's time
# (compiles included); extra holds the compile count.  Targets: at most 2 compiles, the
# total ahead of torch.compile's, per token at least as fast as PyTorch eager.

W16_CONFIGS = ("demo", "lm")
W16_TOKENS = 128


def w16(impls: list[str], args) -> list[Row]:
    rows = []
    impls = [i for i in impls if i != "numpy"]          # (no NumPy model)
    record = tuning_record() if "tracecomp" in impls else None
    env = dict(os.environ, **({"TRACECOMP_TUNING_DIR": os.path.dirname(record)} if record else {}))
    tokens = 16 if args.quick else W16_TOKENS
    for config in W16_CONFIGS:
        results = {}
        for impl in impls:
            title = f"{config} model: {tokens} tokens after {8}"
            row = Row("W16", title, impl, reps=1, calls_per_rep=tokens)
            rows.append(row)
            cmd = [sys.executable, os.path.join(HERE, "generation.py"), "--impl", impl, "--config", config,
                   "--tokens", str(tokens), "--json"]
            try:
                d = results[impl] = child_result(cmd, "W16RESULT", env, CHILD_TIMEOUT_S)
            except Exception as e:
                row.status, row.note = "error", f"{type(e).__name__}: {str(e)[:300]}"
                print(f"  {title:<34} {impl:<14} error: {row.note}", flush=True)
                continue
            row.median_s = row.min_s = row.max_s = d["per_token_s"]
            row.first_call_s = d["total_s"]
            row.extra = {"compiles": d["compiles"], "total_s": d["total_s"],
                         "per_token_last8_s": d["per_token_last8_s"]}
            row.note = f"{d['compiles']} compile(s); total {fmt_time(d['total_s'])} compiles included"
            print(f"  {title:<34} {impl:<14} {fmt_time(d['per_token_s']):>10} per token; {row.note}", flush=True)
        ref = results.get("torch") or next(iter(results.values()), None)
        for row in rows[-len(impls):]:
            d = results.get(row.impl)
            if d is None or ref is None:
                continue
            got, want = np.asarray(d["last_logits"]), np.asarray(ref["last_logits"])
            row.error = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            if d["ids"] != ref["ids"] and row.error > 1e-4:
                row.status = "WRONG"
    return rows


# ----------------------------------------------------------------------------- W5

W5_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
impl = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import bench
bench.pin_threads()
import numpy as np
if impl == "tracecomp":
    import tracecomp as tc
elif impl in ("torch", "torch.compile"):
    import torch
elif impl == "jax.jit":
    import jax
    if len(sys.argv) > 3:
        jax.config.update("jax_compilation_cache_dir", sys.argv[3])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
t_import = time.perf_counter() - t0
params, x, y = bench.w4_data()
stages = {}
t1 = time.perf_counter()
if impl == "tracecomp":
    # the first call, taken apart: f(*args) would run these same steps in this order
    f, args, t = bench.w4_tracecomp_step(), params + [x, y], time.perf_counter()
    for stage, step in [("trace+autodiff+passes", lambda: f.lower(*args)),
                        ("schedule", lambda: f.lower(*args).program),
                        ("compile or load", lambda: f.lower(*args).compiled),
                        ("run", lambda: f(*args))]:
        out = step()
        stages[stage], t = time.perf_counter() - t, time.perf_counter()
    stages["cache"] = "hit" if tc.compile_cache.stats.hits else "miss"
elif impl in ("torch", "torch.compile"):
    out = bench.w4_torch_step(torch, impl == "torch.compile")(*[torch.from_numpy(v) for v in params + [x, y]])
elif impl == "jax.jit":
    out = jax.block_until_ready(bench.w4_jax_step(jax)(params, x, y.astype(np.int32)))
elif impl == "numpy":
    out = bench.w4_numpy(params, x, y)
out = bench.as_numpy(out)
t_first = time.perf_counter() - t1
ref = bench.w4_numpy([p.astype(np.float64) for p in params], x.astype(np.float64), y)
err = bench.w4_error(out, (ref, params))
print("W5RESULT " + json.dumps({"import_s": t_import, "first_call_s": t_first, "error": err, "stages": stages}))
"""


def w5_child(impl: str, cache: Optional[str] = None, env_extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(env_extra or {})
    cmd = [sys.executable, "-c", W5_CHILD, impl, HERE] + ([cache] if cache else [])
    t0 = time.perf_counter()
    d = child_result(cmd, "W5RESULT", env, CHILD_TIMEOUT_S)
    d["process_wall_s"] = time.perf_counter() - t0
    return d


@functools.cache
def tuning_record() -> Optional[str]:
    """The folder of this CPU's tuning record (tracecomp/runtime/tuning.py), measured once per
    run in a child process (its time printed)."""
    folder = tempfile.mkdtemp(prefix="bench-tuning-")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "from tracecomp.runtime import tuning; tuning.ensure_tuned()"],
                       env=dict(os.environ, TRACECOMP_CACHE_DIR=folder, TRACECOMP_TUNING_DIR=folder),  # measured, not found
                       capture_output=True, text=True)
    records = [d for d in os.listdir(folder) if d.startswith("tuning-")] if p.returncode == 0 else []
    print(f"  tracecomp's once-per-CPU tuning: {fmt_time(time.perf_counter() - t0)} in a fresh process"
          + ("" if records else " (nothing to measure on this target)"), flush=True)
    return os.path.join(folder, records[0]) if records else None


def seed_tuning(cache_dir: str) -> None:
    """Give an empty tracecomp cache folder this CPU's tuning record: a cold first call then
    times compiling, as on any machine where tracecomp ran once, not the once-per-CPU search."""
    record = tuning_record()
    if record is not None:
        shutil.copytree(record, os.path.join(cache_dir, os.path.basename(record)))


W5_PAIRS = {"tracecomp": 3, "numpy": 3}     # cold+warm pairs per run (the others: 1, slow)


def w5_pair(impl: str) -> tuple[dict, Optional[dict]]:
    """One cold first call (empty compile cache) and, where there is a persistent cache, one
    warm one: a second fresh process given the first one's cache folder (tracecomp's
    TRACECOMP_CACHE_DIR, torch.compile's inductor cache, jax's persistent compilation cache)."""
    with tempfile.TemporaryDirectory(prefix="bench-w5-") as cache:
        env, cache_arg = {"TRACECOMP_CACHE_DIR": os.path.join(cache, "tracecomp")}, None
        seed_tuning(env["TRACECOMP_CACHE_DIR"])
        if impl == "torch.compile":
            env.update({"TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
                        "TRITON_CACHE_DIR": os.path.join(cache, "triton")})
        if impl == "jax.jit":
            cache_arg = os.path.join(cache, "jax")
        cold = w5_child(impl, cache_arg, env)
        warm = w5_child(impl, cache_arg, env) if impl in ("tracecomp", "torch.compile", "jax.jit") else None
    return cold, warm


def w5_stages(d: dict) -> str:
    return ", ".join(f"{k} {fmt_time(v) if isinstance(v, float) else v}" for k, v in d.get("stages", {}).items())


def w5(impls: list[str], args) -> list[Row]:
    """First call of W4 in a fresh process: trace + autodiff + compile + run (import timed
    apart), cold (empty compile caches) and warm (see w5_pair); medians over W5_PAIRS pairs."""
    rows = []
    if args.quick:
        impls = [i for i in impls if i in ("tracecomp", "numpy")]
    for impl in impls:
        row = Row("W5", "first call of W4 in a fresh process", impl)
        rows.append(row)
        try:
            pairs = [w5_pair(impl) for _ in range(W5_PAIRS.get(impl, 1))]
            colds = [c for c, _ in pairs]
            warms = [w for _, w in pairs if w is not None]
            cold_s = [c["first_call_s"] for c in colds]
            row.error = max(d["error"] for d in colds + warms)
            row.first_call_s = row.median_s = statistics.median(cold_s)
            row.min_s, row.max_s = min(cold_s), max(cold_s)
            row.reps, row.calls_per_rep = len(pairs), 1
            warm_s = statistics.median(w["first_call_s"] for w in warms) if warms else None
            row.extra = {"import_s": statistics.median(c["import_s"] for c in colds),
                         "process_wall_s": statistics.median(c["process_wall_s"] for c in colds),
                         "warm_first_call_s": warm_s,
                         "cold_stages": colds[len(colds) // 2].get("stages"),
                         "warm_stages": warms[len(warms) // 2].get("stages") if warms else None}
            row.note = {"tracecomp": "warm: a 2nd process, same TRACECOMP_CACHE_DIR",
                        "torch": "eager: nothing to compile", "numpy": "nothing to compile"}.get(impl, "")
            if not row.error <= 1e-3:
                row.status = "WRONG"
            print(f"  {'W4 first call':<34} {impl:<14} cold {fmt_time(row.first_call_s)} "
                  f"({fmt_time(row.min_s)} - {fmt_time(row.max_s)}), warm "
                  f"{fmt_time(warm_s) if warms else 'n/a'} "
                  f"(import {fmt_time(row.extra['import_s'])}; err {row.error:.1e})", flush=True)
            for label, d in (("cold", colds[len(colds) // 2]), ("warm", warms[len(warms) // 2] if warms else {})):
                if d.get("stages"):
                    print(f"  {'':<34} {'':<14} {label}: {w5_stages(d)}", flush=True)
        except Exception as e:
            row.status, row.note = "error", f"{type(e).__name__}: {str(e)[:300]}"
            print(f"  {'W4 first call':<34} {impl:<14} error: {row.note}")
    return rows


def ctypes_row(repeat: int) -> Row:
    """Reference for W6: one ctypes call of a C function that does nothing (libc labs), the
    least any call path through ctypes costs."""
    import ctypes
    labs = ctypes.CDLL(None).labs
    labs.argtypes, labs.restype = [ctypes.c_long], ctypes.c_long
    call = lambda: labs(12345)      # noqa: E731
    row = Row("W6", w6_cases()[0].title, "ctypes no-op call", reps=repeat,
              note="reference: one ctypes call of libc labs(), no work")
    row.reps, row.calls_per_rep = calibrate(call, repeat)
    time_interleaved([(row, call)])
    print_row(row)
    return row


# ----------------------------------------------------------------------------- report


def ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return f"{r:.2f}x" if r < 10 else f"{r:.3g}x" if r < 100 else f"{r:.0f}x"


def tables(rows: list[Row]) -> str:
    """Markdown, one table per case: time, spread, x NumPy, tracecomp / this, % of floor."""
    out = []
    cases: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        cases.setdefault((r.workload, r.case), []).append(r)
    for (wl, case), rs in cases.items():
        np_t = next((r.median_s for r in rs if r.impl == "numpy"), None)
        tc_t = next((r.median_s for r in rs if r.impl == "tracecomp"), None)
        floor_s = next((r.floor_s for r in rs if r.floor_s), None)
        note = next((r.extra.get("case_note") for r in rs if r.extra.get("case_note")), None)
        out.append(f"\n{wl}: {case}" + (f" ({note})" if note else "")
                   + (f"; floor {fmt_time(floor_s)}" if floor_s else "") + "\n")
        if wl == "W12c":
            out.append("| impl | first call, cold (median) | range | second call | first - second | runs | note |")
            out.append("|---|---:|---:|---:|---:|---:|---|")
            for r in rs:
                second = r.extra.get("second_call_s")
                compile_s = r.first_call_s - second if second is not None and r.first_call_s is not None else None
                out.append(f"| {r.impl} | {fmt_time(r.first_call_s)} | {fmt_time(r.min_s)} - {fmt_time(r.max_s)} | "
                           f"{fmt_time(second)} | {fmt_time(compile_s)} | {r.reps} | "
                           f"{'' if r.status == 'ok' else r.status + ': '}{r.note} |")
            continue
        if wl == "W5":
            out.append("| impl | first call, cold | first call, warm cache | import | x NumPy | tracecomp / this | note |")
            out.append("|---|---:|---:|---:|---:|---:|---|")
            for r in rs:
                warm = r.extra.get("warm_first_call_s")
                out.append(f"| {r.impl} | {fmt_time(r.median_s)} | {fmt_time(warm) if warm else 'n/a'} | "
                           f"{fmt_time(r.extra.get('import_s'))} | {ratio(r.median_s, np_t)} | "
                           f"{ratio(tc_t, r.median_s)} | {'' if r.status == 'ok' else r.status + ': '}{r.note} |")
            continue
        out.append("| impl | median | spread (min - max) | reps x calls | x NumPy | tracecomp / this | "
                   "% of floor | first call | check err | note |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rs:
            floor = f"{100 * r.floor_s / r.median_s:.1f}%" if r.floor_s and r.median_s else "-"
            err = f"{r.error:.1e}" if r.error is not None else "-"
            spread = f"{fmt_time(r.min_s)} - {fmt_time(r.max_s)}" if r.min_s is not None else "-"
            reps = f"{r.reps}x{r.calls_per_rep}" if r.median_s is not None else "-"
            out.append(f"| {r.impl} | {fmt_time(r.median_s)} | {spread} | {reps} | {ratio(r.median_s, np_t)} | "
                       f"{ratio(tc_t, r.median_s)} | {floor} | {fmt_time(r.first_call_s)} | {err} | "
                       f"{'' if r.status == 'ok' else r.status + ': '}{r.note} |")
    return "\n".join(out)


def combine(paths: list[str]) -> str:
    """Several runs' --json files in one markdown table per case: on a shared machine one
    run's medians move with the load, so each row gives the median over the runs of each
    run's median, their range, and the ratios computed within each run (side by side, as
    measured) and then taken as the median over the runs."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    out = [f"{len(runs)} runs: " + "; ".join(
        f"{os.path.basename(p)}: threads {r['machine'].get('threads')}, tracecomp {r['machine'].get('tracecomp_git')}, "
        "other processes " + ", ".join(f"{w} {100 * v:.0f}%" for w, v in r.get("other_processes_cpu_share", {}).items())
        for p, r in zip(paths, runs))]
    cases: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for run in runs:
        for r in run["rows"]:
            cases.setdefault((r["workload"], r["case"]), {}).setdefault(r["impl"], []).append(r)

    def per_run_ratio(wl, case, impl, num_impl, den_impl):
        vals = []
        for run in runs:
            t = {r["impl"]: r["median_s"] for r in run["rows"] if (r["workload"], r["case"]) == (wl, case)}
            a, b = t.get(num_impl), t.get(den_impl)
            if a and b:
                vals.append(a / b)
        return statistics.median(vals) if vals else None

    def fmt_ratio(x):
        return "-" if x is None else (f"{x:.2f}x" if x < 10 else f"{x:.3g}x" if x < 100 else f"{x:.0f}x")
    for (wl, case), impls in cases.items():
        floors = [r["floor_s"] for rs in impls.values() for r in rs if r.get("floor_s")]
        floor = statistics.median(floors) if floors else None
        out.append(f"\n{wl}: {case}" + (f"; floor {fmt_time(floor)} (median over runs)" if floor else "") + "\n")
        w5 = wl == "W5"
        out.append("| impl | median of run medians | range of run medians | best single repetition | x NumPy | "
                   "tracecomp / this | % of floor | runs |" if not w5 else
                   "| impl | first call, cold (median) | range | warm cache (median) | x NumPy | tracecomp / this | runs |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|" if not w5 else "|---|---:|---:|---:|---:|---:|---:|")
        for impl, rs in impls.items():
            meds = [r["median_s"] for r in rs if r.get("median_s") is not None]
            status = {r["status"] for r in rs} - {"ok"}
            if not meds:
                out.append(f"| {impl} | {', '.join(sorted(status)) or '-'}: {rs[0].get('note', '')} |" + " |" * (6 if not w5 else 5))
                continue
            med = statistics.median(meds)
            rng = f"{fmt_time(min(meds))} - {fmt_time(max(meds))}"
            x_np = per_run_ratio(wl, case, impl, impl, "numpy")
            tc_over = per_run_ratio(wl, case, impl, "tracecomp", impl)
            if w5:
                warm = [r["extra"].get("warm_first_call_s") for r in rs if r.get("extra", {}).get("warm_first_call_s")]
                out.append(f"| {impl} | {fmt_time(med)} | {rng} | {fmt_time(statistics.median(warm)) if warm else 'n/a'} | "
                           f"{fmt_ratio(x_np)} | {fmt_ratio(tc_over)} | {len(meds)} |")
                continue
            best = min(r["min_s"] for r in rs if r.get("min_s") is not None)
            fl = f"{100 * floor / med:.1f}%" if floor else "-"
            out.append(f"| {impl} | {fmt_time(med)} | {rng} | {fmt_time(best)} | {fmt_ratio(x_np)} | "
                       f"{fmt_ratio(tc_over)} | {fl} | {len(meds)} |")
    return "\n".join(out)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--workloads", default=",".join(ALL_WORKLOADS),
                    help="comma-separated subset of W1..W13 (W12c included; default: all)")
    ap.add_argument("--repeat", type=int, default=7, help="timed repetitions per row (default 7)")
    ap.add_argument("--quick", action="store_true",
                    help="at most 3 repetitions, no 4096^3 matmul, W5 for tracecomp and NumPy only, "
                         "W12 at T=100 only and W12c at T=10 and 1000, both without torch.compile, "
                         "W13 on 4096 rows only")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help=f"comma-separated subset of {','.join(IMPLS)} (missing peers are left out)")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for every implementation (OpenMP, BLAS, torch, XLA variables, and each "
                         "child pinned to that many CPUs); default: all cores")
    ap.add_argument("--in-process", action="store_true",
                    help="run all implementations in this process, repetitions interleaved")
    ap.add_argument("--force-slow", action="store_true",
                    help="run tracecomp's 4096^3 matmul even when its 1024^3 run was slow")
    ap.add_argument("--json", help="write all results and machine facts to this file")
    ap.add_argument("--combine", nargs="+", metavar="JSON",
                    help="print one table per case over several runs' --json files, and exit")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "IMPL"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.repeat = min(args.repeat, 3)
    if args.combine:
        print(combine(args.combine))
        return 0
    if args.child:
        return child_main(args.child[0], args.child[1], args.data, args.repeat, args.quick, args.cold)
    canonical = {w.upper(): w for w in ALL_WORKLOADS}
    wanted = [canonical.get(w.strip().upper(), w.strip()) for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in ALL_WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(ALL_WORKLOADS)}")
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    if [i for i in impls if i not in IMPLS]:
        ap.error(f"unknown implementation(s) in {args.impls}; choose from {', '.join(IMPLS)}")
    missing = {"torch": "torch", "torch.compile": "torch", "jax.jit": "jax"}
    absent = [i for i in impls if i in missing and not installed(missing[i])]
    impls = [i for i in impls if i not in absent]

    if args.threads and os.environ.get("BENCH_THREADS") != str(args.threads):
        # thread counts must be set before NumPy's BLAS, torch, XLA and libgomp start: re-exec
        n = str(args.threads)
        env = dict(os.environ, BENCH_THREADS=n, OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n,
                   MKL_NUM_THREADS=n)
        if args.threads == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                "intra_op_parallelism_threads=1").strip()
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

    facts = machine_facts()
    facts["threads"] = args.threads or f"all ({os.cpu_count()})"
    facts["mode"] = "in-process, interleaved" if args.in_process else "one child process per implementation"
    facts["peers_not_installed"] = absent
    started = time.perf_counter()
    meter = CpuMeter()
    meter.start()
    print("machine:", json.dumps(facts))
    bw = copy_bandwidth()
    print(f"copy bandwidth (read+write, best of 15): {bw['best_GBps']:.1f} GB/s ("
          + ", ".join(f"{k}: best {v['best_GBps']:.1f}, median {v['median_GBps']:.1f}"
                      for k, v in bw.items() if isinstance(v, dict)) + ")")
    peak = peak_flops(facts)
    print(f"fp32 peak: {peak['peak'] / 1e9:.0f} GFLOP/s = {peak['formula']}; the FMA loop on all cores at once "
          f"{peak.get(f'fma_loop_{os.cpu_count()}_thread', 0) / 1e9:.0f} GFLOP/s; at the base clock "
          f"{peak['base_clock'] / 1e9:.0f} GFLOP/s; NumPy sgemm 4096^3 {peak['sgemm_4096_numpy'] / 1e9:.0f} GFLOP/s")
    # the floor of a run limited to fewer threads is that of the cores it may use
    ncpu = os.cpu_count() or 1
    cores_used = min(args.threads or ncpu, ncpu)
    bw_bps = (bw["1 thread"]["best_GBps"] if cores_used == 1 else bw["best_GBps"]) * 1e9
    peak_used = peak["peak"] * cores_used / ncpu
    print(f"floors use {bw_bps / 1e9:.1f} GB/s and {peak_used / 1e9:.0f} GFLOP/s ({cores_used} core(s))")
    facts["floor_bandwidth_GBps"], facts["floor_peak_GFLOPs"] = bw_bps / 1e9, peak_used / 1e9
    load = {"machine measurements": meter.others()}

    cases = all_cases(args.quick)
    rows: list[Row] = []
    for w in ALL_WORKLOADS:
        if w not in wanted:
            continue
        print(f"\n{w}", flush=True)
        meter.start()
        if w == "W5":
            rows += w5(impls, args)
        elif w == "W12c":
            rows += w12c(cases, impls, args)
        elif w == "W16":
            rows += w16(impls, args)
        else:
            for case in (c for c in cases.values() if c.workload == w):
                skip = {}
                if case.key == "W3-4096" and "tracecomp" in impls and not args.force_slow:
                    t1024 = next((r.median_s for r in rows if r.workload == "W3" and "1024" in r.case
                                  and r.impl == "tracecomp"), None)
                    if t1024 is None or t1024 > MATMUL_4096_LIMIT_S:
                        skip["tracecomp"] = (f"not run: its 1024^3 matmul took {fmt_time(t1024)}, so 4096^3 "
                                             f"would take ~{fmt_time(64 * t1024) if t1024 else '?'} per call "
                                             "(--force-slow runs it)")
                rows += run_case(case, with_variants(case, impls), args, bw_bps, peak_used, skip)
            if w == "W6":
                rows.append(ctypes_row(args.repeat))
            if w == "W8" and "W8-step" in cases:
                rows += cold_rows(cases["W8-step"], impls, args)
        load[w] = meter.others()
        print(f"  (other processes used {100 * load[w]:.0f}% of the machine's cores meanwhile)", flush=True)
    total = time.perf_counter() - started
    facts["loadavg_at_end"] = os.getloadavg()
    print(tables(rows))
    print(f"\ntotal time {total:.0f} s; load average at start {facts['loadavg_at_start']}, "
          f"at end {facts['loadavg_at_end']}; share of the cores other processes used: "
          + ", ".join(f"{w} {100 * v:.0f}%" for w, v in load.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "machine": facts,
                       "bandwidth": bw, "peak": peak, "other_processes_cpu_share": load, "total_s": total,
                       "rows": [asdict(r) for r in rows]}, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
