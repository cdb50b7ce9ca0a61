"""The fused attention's dedicated PTX kernels (tracecomp/lower/nvptx/attention.py): forward
and gradients on the CPU emulator against the CPU backend (causal or not, odd lengths,
L != S, head dims 8/16/64, masks, broadcast key/value heads), the launch count of a
realistic size (a handful, not one per tile), and ptxas -v: no spills for sm_90."""
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.nvptx.attention import KINDS
from tracecomp.lower.nvptx.launch import plan_kernel
from tracecomp.lower.nvptx.program import compile_program
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.ptxas import assemble, find_ptxas
from tracecomp.runtime.cuda.runner import CudaProgram

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) is not installed")


def _sdpa(causal, scale=None):
    def fn(q, k, v, *mask):
        return tc.nn.functional.scaled_dot_product_attention(q, k, v, *mask, is_causal=causal, scale=scale)
    return fn


def _with_grads(fn):
    """(sum(out * g), d/dq, d/dk, d/dv)."""
    def loss(q, k, v, g, *mask):
        return (fn(q, k, v, *mask) * g).sum()
    return tc.value_and_grad(loss, argnums=(0, 1, 2))


def _inputs(batch, L, S, E, Ev, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (L, E)).astype(np.float32)
    k = rng.standard_normal(batch + (S, E)).astype(np.float32)
    v = rng.standard_normal(batch + (S, Ev)).astype(np.float32)
    g = rng.standard_normal(batch + (L, Ev)).astype(np.float32)
    return q, k, v, g


def _check(fn, args, rtol=1e-4, atol=1e-5):
    low = tc.trace(fn).lower(*args)
    runner = CudaProgram(low.program, EmulatedContext())
    kinds = [l.kind for l in runner.gpu.launches]
    assert any(k in KINDS for k in kinds), kinds
    got, want = runner.on_host(list(args)), low.compiled(list(args))
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, np.asarray(w), rtol=rtol, atol=atol)


CASES = [((2,), 37, 70, 8, 8, False), ((2,), 37, 70, 16, 16, True), ((1,), 70, 37, 16, 8, True),
         ((1,), 70, 70, 64, 64, True), ((), 65, 65, 12, 20, False)]


@pytest.mark.parametrize("batch, L, S, E, Ev, causal", CASES)
def test_forward_matches_cpu(batch, L, S, E, Ev, causal):
    q, k, v, _ = _inputs(batch, L, S, E, Ev)
    _check(_sdpa(causal), (q, k, v))


@pytest.mark.parametrize("batch, L, S, E, Ev, causal", CASES)
def test_gradients_match_cpu(batch, L, S, E, Ev, causal):
    _check(_with_grads(_sdpa(causal)), _inputs(batch, L, S, E, Ev, seed=1))


def test_bool_mask_with_a_row_masked_throughout():
    """The mask is the first product's epilogue, evaluated per element: a row that attends
    to nothing gives 0 (and logsumexp -inf, so no gradient flows through it)."""
    q, k, v, g = _inputs((2,), 37, 70, 8, 8, seed=2)
    mask = np.random.default_rng(3).random((37, 70)) > 0.4
    mask[5] = False
    _check(_sdpa(False), (q, k, v, mask))
    _check(_with_grads(_sdpa(False)), (q, k, v, g, mask))


def test_additive_mask_scale_and_broadcast_key_heads():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 2, 33, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 40, 8)).astype(np.float32)      # one key/value head per item
    v = rng.standard_normal((2, 1, 40, 8)).astype(np.float32)
    mask = rng.standard_normal((1, 40)).astype(np.float32)
    _check(_sdpa(False, 0.7), (q, k, v, mask))
    _check(_with_grads(_sdpa(False, 0.7)), (q, k, v, q.copy(), mask))


def _w8_program():
    x = np.zeros((64, 256, 64), np.float32)
    return tc.trace(_with_grads(_sdpa(True))).lower(x, x, x, x).program


def test_a_realistic_size_is_a_handful_of_launches():
    """B*H = 64, T = 256, d = 64, causal, forward and backward: the unrolled plan was
    thousands of launches; now the forward is one and the backward three."""
    program = _w8_program()
    attention = [k for k in program.kernels if "attention" in k.name]
    assert len(attention) == 2
    before = sum(len(plan_kernel(k)) for k in attention)
    assert before > 1000
    module = compile_program(program, "sm_90")
    after = [l for l in module.launches if l.kernel.name in {k.name for k in attention}]
    assert len(after) == 4, [l.name for l in after]
    assert [l.kind for l in after if l.kind in KINDS] == list(KINDS)


def test_float64_keeps_the_unrolled_plan():
    x = np.zeros((1, 5, 3))
    module = compile_program(tc.trace(_sdpa(True)).lower(x, x, x).program, "sm_90")
    assert not any(l.kind in KINDS for l in module.launches)


@needs_ptxas
@pytest.mark.parametrize("d", [8, 64])
def test_ptxas_sees_no_spills(d):
    x = np.zeros((4, 256, d), np.float32)
    program = tc.trace(_with_grads(_sdpa(True))).lower(x, x, x, x).program
    module = compile_program(program, "sm_90")
    figures = assemble(module.ptx, "sm_90")
    mine = [l.name for l in module.launches if l.kind in KINDS]
    assert len(mine) == 2
    for name in mine:
        f = figures[name]
        assert f.spill_stores == 0 and f.spill_loads == 0 and f.stack_bytes == 0, f
        assert f.shared_bytes < 48 * 1024
