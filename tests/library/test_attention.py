"""The fused attention (scaled_dot_product_attention without dropout): its key blocks, the
online softmax across them, its fused backward, and what it keeps out of memory.

The shared sample table (tests/tables/op_samples.py) covers the op's schema cases with one key
block; here BLOCK is made small so that every case walks several tiles, a shorter
last one included, compiled for the CPU and on the PTX emulator, against NumPy in float64.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracecomp as tc
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.runner import CudaProgram
from tracecomp.lower.schedule import attention
from tracecomp.lower.schedule.scheduler import schedule

from tables.op_samples import _np_attention


@contextlib.contextmanager
def small_blocks():
    old, attention.BLOCK = attention.BLOCK, 3
    try:
        yield
    finally:
        attention.BLOCK = old


def _sdpa(causal: bool, scale):
    def fn(q, k, v, *mask):
        return tc.scaled_dot_product_attention(q, k, v, *mask, is_causal=causal, scale=scale)
    return fn


def _loss_grads(fn):
    def grads(q, k, v, *mask):
        return tc.grad(lambda q, k, v: (fn(q, k, v, *mask) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
    return grads


def _np_grads(q, k, v, mask, scale):
    """d/d(q, k, v) of sum(attention ** 2), by the chain rule in float64."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    out = p @ v
    g = 2 * out
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


def _case(draw_batch, L, S, E, Ev, mask_kind, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(draw_batch + (L, E))
    k = rng.standard_normal(draw_batch + (S, E))
    v = rng.standard_normal(draw_batch + (S, Ev))
    if mask_kind == "bool":
        mask = rng.random((L, S)) > 0.4
        mask[L // 2] = False              # a row that attends to nothing: 0
        return [q, k, v, mask], mask
    if mask_kind == "additive":
        mask = rng.standard_normal((1, S))
        return [q, k, v, mask], mask
    return [q, k, v], np.tril(np.ones((L, S), bool)) if mask_kind == "causal" else None


@settings(max_examples=12, deadline=None)
@given(batch=st.sampled_from([(), (2,), (2, 3)]), L=st.integers(1, 8), S=st.integers(1, 11),
       E=st.integers(1, 5), Ev=st.integers(1, 4), mask_kind=st.sampled_from(["none", "causal", "bool", "additive"]),
       scale=st.sampled_from([None, 0.7]), seed=st.integers(0, 2**31))
def test_blocks_match_numpy(batch, L, S, E, Ev, mask_kind, scale, seed):
    """Forward and gradients over several key blocks of 3 (and a shorter last one)."""
    inputs, mask = _case(batch, L, S, E, Ev, mask_kind, seed)
    fn = _sdpa(mask_kind == "causal", scale)
    with small_blocks():
        got = tc.trace(fn)(*inputs).numpy()
        grads = tc.trace(_loss_grads(fn))(*inputs)
    np.testing.assert_allclose(got, _np_attention(*inputs[:3], mask, scale), rtol=1e-10, atol=1e-12)
    for g, w in zip(grads, _np_grads(*inputs[:3], mask, scale)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-9, atol=1e-11)


def test_blocks_on_the_ptx_emulator():
    """The key-block loop runs as launches from the host, one per block and statement."""
    inputs, _ = _case((2,), 5, 8, 3, 2, "causal", 1)
    with small_blocks():
        low = tc.trace(_loss_grads(_sdpa(True, None))).lower(*inputs)
        got = CudaProgram(low.program, EmulatedContext()).on_host(inputs)
        want = low.compiled(inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_key_value_batch_broadcasts():
    """One key/value head for every query head: read in place with a zero stride."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 4, 6, 3)), rng.standard_normal((2, 1, 7, 3)), rng.standard_normal((1, 7, 2))
    got = tc.trace(_sdpa(False, None))(q, k, v).numpy()
    np.testing.assert_allclose(got, _np_attention(q, np.broadcast_to(k, (2, 4, 7, 3)),
                                                  np.broadcast_to(v, (2, 4, 7, 2))), rtol=1e-12)


def test_scores_never_reach_memory_whole():
    """Forward and backward over 1024 keys: no buffer holds the L x S scores (or an eighth of
    them); the temporaries are (..., BLOCK, BLOCK)."""
    L = S = 1024
    x = np.zeros((2, L, 16), np.float32)
    low = tc.trace(_loss_grads(_sdpa(True, None))).lower(x, x, x)
    program = schedule(low.optimized)
    ops = [op.name for op in low.optimized.ops]
    assert "tc._scaled_dot_product_flash_attention_for_cpu" in ops
    assert "tc._scaled_dot_product_flash_attention_for_cpu_backward" in ops
    largest = max(int(np.prod(b.shape)) for b in program.buffers.values())
    assert largest < L * S // 8, f"a buffer of {largest} elements"


def test_dropout_takes_the_unfused_path():
    """The fused kernel has no dropout (as PyTorch's CPU flash kernel): the composite keeps
    its softmax path for dropout_p > 0, and the fused op itself refuses it."""
    x = np.zeros((2, 4, 3), np.float32)
    ops = [op.name for op in tc.trace(lambda q: tc.scaled_dot_product_attention(q, q, q, dropout_p=0.5)).lower(x).optimized.ops]
    assert "tc._scaled_dot_product_flash_attention_for_cpu" not in ops
    with pytest.raises(tc.TracecompError, match="dropout_p must be 0"):
        tc._scaled_dot_product_flash_attention_for_cpu(tc.tensor(x), tc.tensor(x), tc.tensor(x), 0.5)


@pytest.mark.parametrize("call, match", [
    (lambda q, m: tc._scaled_dot_product_flash_attention_for_cpu(q, q, q, attn_mask=m.to(tc.int64)), "attn_mask must be bool"),
    (lambda q, m: tc._scaled_dot_product_flash_attention_for_cpu(q, q, q, attn_mask=m[:2, :2]), "cannot broadcast"),
    (lambda q, m: tc._scaled_dot_product_flash_attention_for_cpu(q, q[:, :3], q), "share their batch dims"),
    (lambda q, m: tc._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, True, attn_mask=m), "not both"),
])
def test_bad_arguments_name_the_op(call, match):
    q, m = tc.zeros(2, 4, 3), tc.ones(4, 4, dtype=tc.bool)
    with pytest.raises(tc.TracecompError, match=match) as e:
        call(q, m)
    assert "_scaled_dot_product_flash_attention_for_cpu" in str(e.value)


def test_matches_pytorch_flash_kernel():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 9, 4)).astype(np.float32) for _ in range(3))
    g = rng.standard_normal((2, 3, 9, 4)).astype(np.float32)
    for causal in (False, True):
        fwd = tc.trace(lambda q, k, v: tc._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal))
        out, lse = fwd(q, k, v)
        t_out, t_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*map(torch.from_numpy, (q, k, v)), 0.0, causal)
        np.testing.assert_allclose(out.numpy(), t_out.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse.numpy(), t_lse.numpy(), rtol=1e-5, atol=1e-6)
        bwd = tc.trace(lambda *a: tc._scaled_dot_product_flash_attention_for_cpu_backward(*a, 0.0, causal))
        got = bwd(g, q, k, v, out.numpy(), lse.numpy())
        want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *map(torch.from_numpy, (g, q, k, v)), t_out, t_lse, 0.0, causal)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_second_derivatives_traced():
    rng = np.random.default_rng(8)
    inputs = [rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 2))]
    assert tc.gradgradcheck(_sdpa(True, None), inputs, traced=True)


def test_triangular_nest_checks_interprets_and_prints():
    """The causal key loop's trip count depends on the query block (min(qb + 1, blocks)):
    the checker takes it, the loop-IR interpreter runs it, mlir-opt accepts it printed."""
    from lower.test_loops_ir import MLIR_OPT, mlir_opt_accepts
    from tracecomp.lower.loops.check import check_kernel
    from tracecomp.lower.loops.printer import print_kernels
    inputs, _ = _case((2,), 10, 10, 3, 2, "causal", 4)
    fn = _loss_grads(_sdpa(True, None))
    with small_blocks():
        want = [g.numpy() for g in tc.trace(fn)(*inputs)]
        got = [g.numpy() for g in tc.trace(fn, backend="interp")(*inputs)]
        kernels = schedule(tc.trace(fn).lower(*inputs).optimized).kernels
    triangular = [s for k in kernels for s in _loops(k.body) if not isinstance(s.extent, int)]
    assert triangular, "no key loop bounded by the query block"
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    for k in kernels:
        check_kernel(k)
    if MLIR_OPT is not None:
        mlir_opt_accepts(print_kernels(kernels))


def _loops(body):
    from tracecomp.lower.loops.ir import Loop
    from tracecomp.lower.loops.walk import statements
    return [s for s in statements(body) if isinstance(s, Loop)]


def test_exported_library_matches_trace(tmp_path):
    """The per-thread products and the triangular nest in a dependency-free .so (real cc)."""
    inputs, _ = _case((2, 3), 70, 70, 4, 3, "causal", 6)
    inputs = [x.astype(np.float32) for x in inputs]
    fn = _loss_grads(_sdpa(True, None))
    path = str(tmp_path / "libattention.so")
    tc.export(fn, inputs, path)
    got, want = tc.load(path)(*inputs), tc.trace(fn)(*inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


def test_threads_never_share_a_workspace_slice():
    """Batch items run on several threads, each packing its products into its own slice of
    the one workspace; the products differ in size (full and last tiles), so slices sized
    per product overlapped.  Repeated calls must all give the single-threaded answer."""
    inputs, mask = _case((2, 3), 70, 70, 4, 3, "causal", 6)
    inputs = [x.astype(np.float32) for x in inputs]
    want = _np_grads(*[x.astype(np.float64) for x in inputs[:3]], mask, None)
    f = tc.trace(_loss_grads(_sdpa(True, None)))
    for _ in range(20):
        for g, w in zip(f(*inputs), want):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-4)
