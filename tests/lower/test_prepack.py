"""A loop's weights packed once before the loop (schedule/prepack.py): the products of a scan
body whose B is a const read panels a PackB kernel packed, and compute what they did."""
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.loops import control as C
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.check import check_kernel
from tracecomp.lower.loops.interp import run_program
from tracecomp.lower.loops.walk import statements


def _recurrence(h, w, xs, transposed):
    for x in xs:
        h = np.tanh(x + h @ (w.T if transposed else w))[:, :h.shape[1]]
    return h


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k, n, transposed", [(64, 96, False), (200, 230, True), (400, 2100, False)])
def test_a_scan_weight_is_packed_once_and_the_loop_computes_the_same(dtype, k, n, transposed):
    """k = 400 spans several K blocks, n = 2100 two column blocks and a partial micro-panel;
    a transposed weight is read through its strides."""
    rng = np.random.default_rng(k)
    w = (rng.standard_normal((n, k) if transposed else (k, n)) / np.sqrt(k)).astype(dtype)
    xs = rng.standard_normal((3, 40, n)).astype(dtype)
    h0 = rng.standard_normal((40, k)).astype(dtype)

    def f(h0, w, xs):
        def cell(h, x):
            return tc.tanh(x + h @ (w.T if transposed else w))[:, :k], None
        return tc.scan(cell, h0, xs)[0]
    traced = tc.trace(f)
    lowered = traced.lower(h0, w, xs)
    program = lowered.cpu_program
    packs = [s for kern in program.kernels for s in statements(kern.body) if isinstance(s, L.PackB)]
    products = [s for kern in program.kernels for s in statements(kern.body) if isinstance(s, L.Matmul)]
    assert len(packs) == 1 and [p.b_packed is not None for p in products] == [True]
    assert isinstance(program.steps[-1], C.Scan) and packs[0].buffer in program.steps[-1].consts
    for kern in program.kernels:
        check_kernel(kern)
    want = _recurrence(h0.astype(np.float64), w.astype(np.float64), xs, transposed)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(traced(h0, w, xs)), want, rtol=tol, atol=tol)
    if k * n <= 64 * 96 and dtype == np.float64:      # the interpreter is Python: one step, one case
        first = _recurrence(h0.astype(np.float64), w.astype(np.float64), xs[:1], transposed)
        program1 = traced.lower(h0, w, xs[:1]).cpu_program
        np.testing.assert_allclose(run_program(program1, [h0, w, xs[:1]])[0], first, rtol=tol, atol=tol)
    assert lowered.program is not program and not any(
        isinstance(s, L.PackB) for kern in lowered.program.kernels for s in statements(kern.body))


def test_the_gradient_through_a_packed_weight():
    """Both scans of a value_and_grad (the forward's h @ W and the backward's dh @ W^T) pack
    their weight once; the gradient matches the unrolled loop's."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((96, 96)) * 0.1).astype(np.float32)
    xs = rng.standard_normal((4, 32, 96)).astype(np.float32)

    def loss(w, xs, unrolled):
        h = tc.zeros((32, 96))
        if unrolled:
            for t in range(xs.shape[0]):
                h = tc.tanh(xs[t] + h @ w)
        else:
            h = tc.scan(lambda h, x: (tc.tanh(x + h @ w), None), h, xs)[0]
        return (h * h).sum()
    scanned = tc.trace(tc.grad(lambda w, xs: loss(w, xs, False), argnums=(0, 1)))
    program = scanned.lower(w, xs).cpu_program
    assert sum(isinstance(s, L.PackB) for kern in program.kernels for s in statements(kern.body)) == 2
    want = tc.trace(tc.grad(lambda w, xs: loss(w, xs, True), argnums=(0, 1)))(w, xs)
    for got, ref in zip(scanned(w, xs), want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-4, atol=2e-5)


def test_the_checker_refuses_a_short_packed_buffer():
    view = L.View("b", L.Const(0, L.INDEX), (L.Const(8, L.INDEX), L.Const(1, L.INDEX)))
    kernel = L.Kernel("k", [L.Buffer("b", tc.float32, (4, 8), "input"), L.Buffer("p", tc.float32, (16,), "temp")],
                      [L.PackB("p", view, 4, 8)])
    with pytest.raises(tc.TracecompError, match="holds 16 elements; a 4x8 matrix needs 32"):
        check_kernel(kernel)


def test_a_half_scan_weight_is_left_to_its_path():
    """A bfloat16 weight in a scan (autocast's h @ w): the product packs it in its half
    path's layout at each call; a PackB (float32 panels) would not fit, so none is made."""
    rng = np.random.default_rng(0)
    h0 = rng.standard_normal((16, 64)).astype(np.float32)
    xs = rng.standard_normal((4, 16, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 64)) / 8).astype(tc.bfloat16.np)

    def f(h0, xs, w):
        def cell(h, x):
            h = tc.tanh(h.to(tc.bfloat16).to(tc.float32) @ w.to(tc.float32) + x)
            return h, None
        return tc.scan(cell, h0, xs)[0]
    traced = tc.trace(f)
    program = traced.lower(h0, xs, w).cpu_program
    assert not [s for kern in program.kernels for s in statements(kern.body) if isinstance(s, L.PackB)]
    want = h0.astype(np.float64)
    for x in xs:
        want = np.tanh(want.astype(np.float32).astype(tc.bfloat16.np).astype(np.float64) @ w.astype(np.float64) + x)
    assert np.abs(np.asarray(traced(h0, xs, w)) - want).max() <= 1e-5
