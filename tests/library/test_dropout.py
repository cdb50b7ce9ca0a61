"""dropout's random mask: its statistics and scaling, tc.manual_seed's reproducibility, a
fresh mask on every compiled call, the gradient as the same mask times the scale, the
deterministic cases (p=0, p=1, training=False), inplace=True and the bad p."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

X = np.random.default_rng(5).uniform(0.5, 2.0, (200, 500)).astype(np.float32)     # no zeros


def _eager(x, **kw):
    return tc.dropout(tc.tensor(x), **kw).numpy()


CALLS = {"eager": _eager, "compiled": lambda x, **kw: tc.trace(lambda a: tc.dropout(a, **kw))(x).numpy()}


@pytest.mark.parametrize("mode", CALLS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_the_mask_drops_a_fraction_p_and_scales_the_rest(mode, p):
    out = CALLS[mode](X, p=p)
    kept = out != 0
    assert out.dtype == np.float32 and out.shape == X.shape
    assert abs(1 - kept.mean() - p) < 0.01                        # 100,000 draws: 0.01 is over 6 sigma
    np.testing.assert_allclose(out[kept], X[kept] / (1 - p), rtol=1e-6)
    assert abs(kept.mean(0).std() - np.sqrt(p * (1 - p) / 200)) < 0.01    # columns alike: no pattern


@pytest.mark.parametrize("mode", CALLS)
def test_manual_seed_repeats_the_mask(mode):
    tc.manual_seed(7)
    a = CALLS[mode](X)
    tc.manual_seed(7)
    b = CALLS[mode](X)
    np.testing.assert_array_equal(a, b)


def test_every_compiled_call_draws_a_fresh_mask_and_two_dropouts_differ():
    f = tc.trace(lambda x: (tc.dropout(x), tc.dropout(x)))
    first, second = f(X)
    again, _ = f(X)
    assert not np.array_equal(first.numpy(), again.numpy())
    assert not np.array_equal(first.numpy(), second.numpy())     # not merged as common subexpressions


@pytest.mark.parametrize("traced", [False, True])
def test_the_gradient_is_the_same_mask_times_the_scale(traced):
    """One call gives the output (as aux) and the gradient: they share the mask."""
    cotangent = np.random.default_rng(1).uniform(0.5, 1.5, X.shape).astype(np.float32)

    def loss(x):
        out = tc.dropout(x, p=0.25)
        return (out * tc.tensor(cotangent)).sum(), out
    step = tc.value_and_grad(loss, has_aux=True)
    (_, out), grad = tc.trace(step)(X) if traced else step(tc.tensor(X))
    kept = out.numpy() != 0
    assert abs(1 - kept.mean() - 0.25) < 0.01
    np.testing.assert_allclose(grad.numpy(), np.where(kept, cotangent / 0.75, 0), rtol=1e-6)


@pytest.mark.parametrize("mode", CALLS)
def test_p_zero_and_evaluation_return_the_input_and_p_one_zeros(mode):
    np.testing.assert_array_equal(CALLS[mode](X, p=0.0), X)
    np.testing.assert_array_equal(CALLS[mode](X, training=False), X)
    np.testing.assert_array_equal(CALLS[mode](X, p=1.0), np.zeros_like(X))
    x = tc.tensor(X)
    assert tc.dropout(x, training=False) is x                     # as torch: the input itself


def test_gradients_of_the_deterministic_cases():
    for kw, want in ((dict(p=0.0), 1.0), (dict(training=False), 1.0), (dict(p=1.0), 0.0)):
        g = tc.trace(tc.grad(lambda x: tc.dropout(x, **kw).sum()))(X[:3])
        np.testing.assert_array_equal(g.numpy(), np.full_like(X[:3], want))


def test_inplace_changes_the_input_eagerly_and_the_callers_array_when_traced():
    x = tc.tensor(X)
    out = tc.dropout(x, p=0.5, inplace=True)
    assert out is x and x._version == 1 and (x.numpy() == 0).any()
    a = X.copy()
    out = tc.trace(lambda t: tc.dropout(t, p=0.5, inplace=True))(a)
    np.testing.assert_array_equal(out.numpy(), a)
    assert (a == 0).any() and np.allclose(a[a != 0], X[a != 0] * 2)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_p_outside_zero_one_is_refused(p):
    with pytest.raises(tc.ArgumentError, match=f"between 0 and 1, but got {p}"):
        tc.dropout(tc.tensor(X), p)


@pytest.mark.parametrize("traced", [False, True])
def test_attention_dropout_is_dropout_of_the_attention_weights(traced):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))

    def fused(q, k, v):
        return tc.scaled_dot_product_attention(q, k, v, dropout_p=0.4, is_causal=True)

    def spelled_out(q, k, v):
        scores = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~tc.tril(tc.ones(3, 5, dtype=tc.bool)), float("-inf"))
        return tc.dropout(tc.softmax(scores, -1), 0.4) @ v
    run = (lambda f: tc.trace(f)) if traced else (lambda f: (lambda *a: f(*[tc.tensor(x) for x in a])))
    tc.manual_seed(7)
    got = run(fused)(q, k, v).numpy()
    tc.manual_seed(7)
    want = run(spelled_out)(q, k, v).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
