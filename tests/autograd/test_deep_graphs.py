"""Unrolled loops (issue 35): a graph thousands of ops deep traces, differentiates, optimizes
and compiles without Python recursion, and gives the eager / NumPy values.

The 1,500-step chain and the eager functional grad are deeper than Python's default
recursion limit allows a recursive walk to go (autograd's `_needed` and the scheduler's
inlining both recursed once per op); the 20,000-step chain and the LSTM over 200 steps are
slow (TRACECOMP_SLOW=1).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tracecomp as tc

SLOW = pytest.mark.skipif(not os.environ.get("TRACECOMP_SLOW"), reason="deep graph (~30-60 s): set TRACECOMP_SLOW=1")


def _tanh_chain(n):
    def loss(x):
        for _ in range(n):
            x = tc.tanh(x)
        return x.sum()
    return loss


def _tanh_chain_reference(x, n):
    """(sum of tanh applied n times, its gradient), in float64."""
    ys = [x.astype(np.float64)]
    for _ in range(n):
        ys.append(np.tanh(ys[-1]))
    g = np.ones_like(ys[0])
    for y in reversed(ys[1:]):
        g = g * (1 - y * y)
    return ys[-1].sum(), g


def _check_tanh_chain(n):
    x = np.random.default_rng(n).uniform(-2, 2, (4, 8)).astype(np.float32)
    value, grad = tc.trace(tc.value_and_grad(_tanh_chain(n)))(x)
    want_value, want_grad = _tanh_chain_reference(x, n)
    np.testing.assert_allclose(float(value), want_value, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-3, atol=1e-6)


def test_value_and_grad_of_a_1500_step_tanh_chain_compiles():
    _check_tanh_chain(1500)


def test_eager_functional_grad_of_a_3000_step_chain():
    x = np.random.default_rng(0).uniform(-2, 2, (3,)).astype(np.float32)
    got = tc.grad(_tanh_chain(3000))(tc.tensor(x))
    np.testing.assert_allclose(np.asarray(got), _tanh_chain_reference(x, 3000)[1], rtol=1e-3, atol=1e-6)


def test_compiling_a_chain_needs_no_more_stack_than_a_short_one():
    """Under a recursion limit of 500, below the chain's 1,000 steps: no walk of the trace,
    the backward, the passes, the scheduling or the code generation recurses per step."""
    fn = tc.trace(tc.value_and_grad(_tanh_chain(1000)))
    x = np.random.default_rng(3).uniform(-2, 2, (4, 8)).astype(np.float32)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)
    try:
        value, grad = fn(x)
    finally:
        sys.setrecursionlimit(limit)
    np.testing.assert_allclose(np.asarray(grad), _tanh_chain_reference(x, 1000)[1], rtol=1e-3, atol=1e-6)


@pytest.mark.slow
@SLOW
def test_value_and_grad_of_a_20000_step_tanh_chain_compiles():
    _check_tanh_chain(20_000)


# ------------------------------------------------------------------ an LSTM unrolled

B, I, H = 8, 16, 32


def _lstm_loss(wx, wh, b, xs, h, c):
    for t in range(xs.shape[0]):
        g = xs[t] @ wx + h @ wh + b
        i, f = tc.sigmoid(g[:, :H]), tc.sigmoid(g[:, H:2 * H])
        o, u = tc.sigmoid(g[:, 2 * H:3 * H]), tc.tanh(g[:, 3 * H:])
        c = f * c + i * u
        h = o * tc.tanh(c)
    return (h * h).mean()


def _check_lstm(steps):
    rng = np.random.default_rng(steps)
    shapes = [(I, 4 * H), (H, 4 * H), (4 * H,), (steps, B, I), (B, H), (B, H)]
    args = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in shapes]
    value, grads = tc.trace(tc.value_and_grad(_lstm_loss, argnums=(0, 1, 2)))(*args)
    params = [tc.tensor(a.astype(np.float64), requires_grad=True) for a in args[:3]]
    want = _lstm_loss(*params, *[tc.tensor(a.astype(np.float64)) for a in args[3:]])
    want.backward()
    np.testing.assert_allclose(float(value), float(want.detach().numpy()), rtol=1e-4)
    for got, p in zip(grads, params):
        scale = np.abs(p.grad.numpy()).max()
        np.testing.assert_allclose(np.asarray(got), p.grad.numpy(), rtol=1e-3, atol=1e-4 * scale)


def test_value_and_grad_of_an_lstm_unrolled_over_30_steps_matches_eager():
    _check_lstm(30)


@pytest.mark.slow
@SLOW
def test_value_and_grad_of_an_lstm_unrolled_over_200_steps_matches_eager():
    _check_lstm(200)
