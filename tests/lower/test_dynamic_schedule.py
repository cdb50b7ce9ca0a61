"""Dynamic sizes schedule as static ones do (issue 36: a dynamic compile costs little at
run time): a layer norm feeding a linear stays one row kernel, a linear's bias and
residual fold into the product's epilogue, and a reshape's index divides only the dims
it merges.  Results are checked against eager at several sizes."""
from __future__ import annotations

import numpy as np

import tracecomp as tc
from tracecomp.core.symbolic import Dim
from tracecomp.lower.loops import index as I
from tracecomp.lower.loops import ir as L


def _pre_norm_block(x, w, b, g, beta):
    F = tc.nn.functional
    return x + F.linear(F.layer_norm(x, [x.shape[-1]], g, beta), w, b)


def _compiled(dynamic: bool):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 32)).astype(np.float32) / 6
    b, g, beta = (rng.standard_normal(32).astype(np.float32) for _ in range(3))
    f = tc.trace(_pre_norm_block, dynamic=dynamic)
    for bs, t in ((2, 3), (5, 7), (3, 40)):
        x = rng.standard_normal((bs, t, 32)).astype(np.float32)
        want = _pre_norm_block(*(tc.tensor(a) for a in (x, w, b, g, beta)))
        np.testing.assert_allclose(f(x, w, b, g, beta).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
        if not dynamic:
            break
    (lowered,) = f._cache.values()
    assert lowered.dynamic == dynamic
    return lowered.cpu_program.kernels


def test_a_dynamic_pre_norm_linear_has_the_kernels_of_the_static_one():
    """Two kernels as in the static compile: the layer norm in one row kernel (its
    flattened rows read in place by the product), then the product with the bias and the
    residual as its epilogue (fused through the reshape back to (batch, seq, n))."""
    dynamic, static = _compiled(True), _compiled(False)
    assert len(dynamic) == len(static) == 2
    norm, product = dynamic
    assert "mean" in norm.name and not any(isinstance(s, L.Matmul) for s in norm.body)
    (mm,) = [s for s in product.body if isinstance(s, L.Matmul)]
    assert mm.epilogue is not None and "add" in product.name


def test_a_symbolic_reshape_divides_only_the_dims_it_merges():
    """(s0*s1, 384) read as (s0, s1, 384): the row index splits, the column passes through."""
    s0, s1 = Dim.named("s0", 4), Dim.named("s1", 6)
    i, j = L.Var("i", L.INDEX), L.Var("j", L.INDEX)
    a, b, c = I.reshape((i, j), (s0 * s1, 384), (s0, s1, 384))
    assert c is j and "384" not in repr(a) + repr(b)
    (row, col) = I.reshape((a, b, c), (s0, s1, 384), (s0 * s1, 384))
    assert col is j


def test_dynamic_attention_is_tiled_and_matches_eager_at_every_length():
    """Attention over a dynamic sequence runs in BLOCK tiles (their count and the last
    one's length computed at run time, the last perhaps empty), causal or with a mask,
    forward and backward: lengths below, at, and past multiples of the block."""
    from tracecomp.lower.schedule.attention import BLOCK
    F = tc.nn.functional

    def loss(q, k, v, causal):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=causal) ** 2).sum()

    rng = np.random.default_rng(1)
    for causal in (True, False):
        f = tc.trace(lambda q, k, v: loss(q, k, v, causal), dynamic=True)
        g = tc.trace(tc.grad(lambda q, k, v: loss(q, k, v, causal), argnums=(0, 1, 2)), dynamic=True)
        for b, t in ((3, 5), (4, BLOCK), (3, 2 * BLOCK + 7), (5, BLOCK + 1)):     # (sizes unequal: no duck sizing)
            q, k, v = (rng.standard_normal((b, 2, t, 16)).astype(np.float32) for _ in range(3))
            eager = [tc.tensor(a) for a in (q, k, v)]
            np.testing.assert_allclose(f(q, k, v).numpy(), loss(*eager, causal).numpy(), rtol=1e-4)
            for got, want in zip(g(q, k, v), tc.grad(lambda *a: loss(*a, causal), argnums=(0, 1, 2))(*eager)):
                np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)
        assert len(f.signatures) == len(g.signatures) == 1
        (lowered,) = f._cache.values()
        assert lowered.dynamic and all(b.shape[-2:] == (BLOCK, BLOCK) for k in lowered.cpu_program.kernels
                                       for b in k.buffers if b.name.startswith("ap"))


def test_the_jit_entry_point_keeps_its_workspace_between_calls():
    """The dynamic entry point takes the block its last call left when it is large enough
    (a fresh block past malloc's mmap threshold is page-faulted every call), else a new
    one; calls from several threads each get their own; NAME_release frees it."""
    import threading
    fn = lambda x, w: tc.relu(x @ w) @ w.T + (x * 2).sum()          # noqa: E731  (temps)
    f = tc.trace(fn, dynamic=True)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((33, 20)).astype(np.float32)

    def check(x):
        return np.allclose(f(x, w).numpy(), fn(tc.tensor(x), tc.tensor(w)).numpy(), rtol=1e-4, atol=1e-3)
    for n in (300, 40, 300, 2000, 7, 2000):           # shrinking reuses, growing replaces
        assert check(rng.standard_normal((n, 33)).astype(np.float32))
    (lowered,) = f._cache.values()
    assert lowered.dynamic and any(b.role == "temp" for b in lowered.cpu_program.buffers.values())
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        for _ in range(20):
            if not check(r.standard_normal((int(r.integers(2, 900)), 33)).astype(np.float32)):
                errors.append(seed)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    lowered.compiled.release_workspace()        # freed: the next call allocates again
    assert check(rng.standard_normal((50, 33)).astype(np.float32))


def test_dynamic_row_kernels_are_parallel_where_static_ones_are():
    """A row kernel or reduction over dynamic rows goes parallel as loop_nest decides, at
    the example sizes (it stayed on one core whatever the rows)."""
    def parallel(dynamic, fn, x):
        f = tc.trace(fn, dynamic=dynamic)
        f(x)
        (lowered,) = f._cache.values()
        return [any(isinstance(s, L.Loop) and s.parallel for s in k.body) for k in lowered.cpu_program.kernels]
    x = np.random.default_rng(3).standard_normal((2048, 512)).astype(np.float32)
    for fn in (lambda x: tc.softmax(x, dim=-1), lambda x: tc.exp(x).sum(-1)):
        assert parallel(True, fn, x) == parallel(False, fn, x) == [True]
