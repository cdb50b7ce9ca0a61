"""Kernel-only times of tracecomp's CUDA kernels next to PyTorch CUDA eager (needs a GPU,
its driver and torch with CUDA).  Host copies are excluded: the inputs are copied to the
device once, then a compiled program's launches are queued `reps` times between two
synchronizations.  Prints, per case: tracecomp ms, torch ms, torch/tracecomp, GB/s or
TFLOP/s, and the relative error against torch in float64.

    python benchmarks/gpu_kernels.py            # the four cases
    python benchmarks/gpu_kernels.py --before   # also with the previous kernels (scalar
                                                # elementwise, 64x64 matmul, rows from memory)
    python benchmarks/gpu_kernels.py --sweep    # and the elementwise grid size
"""
from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
import torch

import tracecomp as tc
from tracecomp.lower.nvptx import launch as L
from tracecomp.runtime.cuda.runner import CudaProgram


def _alloc_all(prog, inputs):
    """Device pointers for every buffer the launches name (inputs copied in)."""
    ctx, p = prog.ctx, prog.program
    ptrs = dict(prog.device)
    for name, a in zip(p.inputs, inputs):
        ptrs[name] = ctx.alloc(a.nbytes)
        ctx.to_device(ptrs[name], a)
    for _, launch in prog.calls:
        for name in launch.params:
            if name not in ptrs:
                b = p.buffers[name]
                ptrs[name] = ctx.alloc(max(1, int(np.prod(b.shape)) * np.dtype(b.dtype.np).itemsize))
    return ptrs


def tc_ms(fn, inputs, reps):
    low = tc.trace(fn, device="cuda").lower(*inputs)
    prog = CudaProgram(low.program)
    ctx = prog.ctx
    ptrs = _alloc_all(prog, inputs)

    def once():
        for f, l in prog.calls:
            prog._launch(f, l, ptrs)
    once()
    ctx.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        once()
    ctx.synchronize()
    ms = (time.perf_counter() - t) / reps * 1e3
    out = prog.program.outputs[0]
    b = prog.program.buffers[out]
    got = ctx.to_host(np.empty(tuple(b.shape), np.dtype(b.dtype.np)), ptrs[out])
    plan = [(l.kind, l.grid, l.block) for _, l in prog.calls]
    for ptr in {v for k, v in ptrs.items() if k not in prog.device}:
        ctx.free(ptr)
    return ms, got, plan


def torch_ms(fn, inputs, reps):
    xs = [torch.from_numpy(a).cuda() for a in inputs]
    fn(*xs)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn(*xs)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3, fn(*[x.double() for x in xs]).cpu().numpy()


@contextlib.contextmanager
def previous_kernels():
    """The kernels before vector.py, sgemm.py and rowcache.py (for --before)."""
    saved = (L.LARGE_MATMUL_MIN_TILES, L.contiguous_buffers, L.cache_extent)
    L.LARGE_MATMUL_MIN_TILES = 1 << 40
    L.contiguous_buffers = lambda *a: set()
    L.cache_extent = lambda *a: None
    try:
        yield
    finally:
        L.LARGE_MATMUL_MIN_TILES, L.contiguous_buffers, L.cache_extent = saved


def main(argv):
    rng = np.random.default_rng(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x = rng.standard_normal(1 << 26).astype(np.float32)
    rows = rng.standard_normal((8192, 4096)).astype(np.float32)
    a = rng.standard_normal((4096, 4096)).astype(np.float32)
    b = rng.standard_normal((4096, 4096)).astype(np.float32)
    chain = lambda x: ((x * 2 + 1).exp() * 0.5).tanh()
    cases = [
        ("chain 2^26 f32", chain, chain, [x], 8 * x.size, None),
        ("softmax 8192x4096", lambda r: tc.softmax(r, dim=-1), lambda r: torch.softmax(r, -1), [rows], 8 * rows.size, None),
        ("row sum 8192x4096", lambda r: r.sum(dim=-1), lambda r: r.sum(-1), [rows], 4 * rows.size, None),
        ("layernorm 8192x4096", lambda r: tc.layer_norm(r, (4096,)),
         lambda r: torch.nn.functional.layer_norm(r, (4096,)), [rows], 8 * rows.size, None),
        ("matmul 4096^3 f32", lambda a, b: a @ b, lambda a, b: a @ b, [a, b], None, 2 * 4096 ** 3),
    ]
    variants = [("new", contextlib.nullcontext)] + ([("before", previous_kernels)] if "--before" in argv else [])
    print(f"{'case':22s} {'kernels':7s} {'tc ms':>8s} {'torch ms':>9s} {'ratio':>6s} {'rate':>14s} {'rel err':>8s}  launches")
    for name, f, g, ins, nbytes, flops in cases:
        reps = 10 if flops else 50
        try:
            tms, want = torch_ms(g, ins, reps)
        except Exception as e:          # noqa: BLE001 (a benchmark reports and goes on)
            print(f"{name}: torch failed: {e}")
            continue
        for label, ctx in variants:
            try:
                with ctx():
                    ms, got, plan = tc_ms(f, ins, reps)
                err = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
                rate = f"{nbytes / ms / 1e6:.0f} GB/s" if nbytes else f"{flops / ms / 1e9:.1f} TFLOP/s"
                print(f"{name:22s} {label:7s} {ms:8.3f} {tms:9.3f} {tms / ms:6.2f} {rate:>14s} {err:8.1e}  {plan}",
                      flush=True)
            except Exception as e:      # noqa: BLE001
                print(f"{name} ({label}): FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


def sweep():
    """The vector elementwise grid (launch.VECTOR_BLOCKS) against the chain's time."""
    x = np.random.default_rng(0).standard_normal(1 << 26).astype(np.float32)
    chain = lambda x: ((x * 2 + 1).exp() * 0.5).tanh()
    saved = L.VECTOR_BLOCKS
    for blocks in (132 * 2, 132 * 4, 132 * 8, 132 * 16, 132 * 64, 65535):
        L.VECTOR_BLOCKS = blocks
        ms, _, plan = tc_ms(chain, [x], 50)
        print(f"chain grid {blocks:6d}: {ms:.4f} ms {8 * x.size / ms / 1e6:.0f} GB/s {plan}", flush=True)
    L.VECTOR_BLOCKS = saved


if __name__ == "__main__":
    main(sys.argv[1:])
    if "--sweep" in sys.argv:
        sweep()
