"""What the shared samples cannot show for issue 12's ops: batch_norm's and instance_norm's
in-place running statistics (eager, traced, inside a traced training step; against torch),
embedding's padding row without gradient, and one_hot's data-dependent num_classes=-1.
The outputs themselves are checked by the samples (op_samples.py) and the OpInfo tests."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle)")
F = torch.nn.functional

rng = np.random.default_rng(12)
X = rng.standard_normal((6, 3, 4)).astype(np.float32)
MEAN, VAR = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2.0, 3).astype(np.float32)


def _torch_stats(fn, x, steps: int, **kw):
    """torch's running statistics after `steps` calls of fn on x, and its last output."""
    mean, var = torch.tensor(MEAN), torch.tensor(VAR)
    for _ in range(steps):
        out = fn(torch.tensor(x), mean, var, **kw)
    return out.numpy(), mean.numpy(), var.numpy()


@pytest.mark.parametrize("op", ["batch_norm", "instance_norm"])
@pytest.mark.parametrize("backend", ["cpu", "interp"])
def test_a_traced_call_updates_the_callers_running_stats_as_eager_and_torch(op, backend):
    kw = dict(training=True) if op == "batch_norm" else {}
    want_out, want_mean, want_var = _torch_stats(getattr(F, op), X, 3, momentum=0.2, **kw)
    step = tc.trace(lambda x, m, v: getattr(tc, op)(x, m, v, momentum=0.2, **kw), backend=backend)
    arrays = [MEAN.copy(), VAR.copy()]                   # NumPy arrays are overwritten
    tensors = [tc.tensor(MEAN), tc.tensor(VAR)]          # tensors take their new values over
    eager = [tc.tensor(MEAN), tc.tensor(VAR)]
    for _ in range(3):
        out = step(X, *arrays)
        step(X, *tensors)
        eager_out = getattr(tc, op)(tc.tensor(X), *eager, momentum=0.2, **kw)
    for got in (arrays, [t.numpy() for t in tensors], [t.numpy() for t in eager]):
        np.testing.assert_allclose(got[0], want_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], want_var, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(eager_out.numpy(), want_out, rtol=1e-4, atol=1e-5)


def test_a_traced_training_step_updates_running_stats_and_weights_as_torch():
    """A batch-norm layer's step: value_and_grad through it, SGD on the weight, the running
    statistics updated once per step as torch's would be."""
    w0 = rng.standard_normal((4, 3)).astype(np.float32)

    def loss(w, x, mean, var):
        h = tc.batch_norm(x @ w, mean, var, training=True)
        return (h * h * h).mean()

    @tc.trace
    def step(w, x, mean, var):
        value, g = tc.value_and_grad(loss)(w, x, mean, var)
        w -= 0.1 * g
        return value

    x = rng.standard_normal((8, 4)).astype(np.float32)
    w, mean, var = w0.copy(), MEAN.copy(), VAR.copy()
    tw, tmean, tvar = torch.tensor(w0, requires_grad=True), torch.tensor(MEAN), torch.tensor(VAR)
    for _ in range(3):
        value = step(w, x, mean, var)
        h = F.batch_norm(torch.tensor(x) @ tw, tmean, tvar, training=True)
        want = (h * h * h).mean()
        want.backward()
        with torch.no_grad():
            tw -= 0.1 * tw.grad
            tw.grad = None
        np.testing.assert_allclose(value.numpy(), want.item(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w, tw.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, tmean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, tvar.numpy(), rtol=1e-5, atol=1e-6)


def test_evaluation_mode_leaves_the_running_stats_alone_and_writes_nothing_back():
    mean, var = tc.tensor(MEAN), tc.tensor(VAR)
    f = tc.trace(lambda x, m, v: tc.batch_norm(x, m, v))
    f(X, mean, var)
    tc.batch_norm(tc.tensor(X), mean, var)
    assert mean._version == var._version == 0
    np.testing.assert_array_equal(mean.numpy(), MEAN)
    graph = f.lower(X, MEAN, VAR).graph
    assert len(graph.outputs) == 1                  # the result only: no running stats written back
    assert {op.loc.source for op in graph.ops} == {"tc.batch_norm"}     # its pieces, as any composite's


def test_running_stats_keep_their_dtype_and_an_empty_batch_leaves_them():
    mean, var = tc.tensor(MEAN), tc.tensor(VAR)
    tc.batch_norm(tc.tensor(X.astype(np.float64)), mean, var, training=True)
    assert mean.dtype is tc.float32 and var.dtype is tc.float32
    before = mean.numpy().copy()
    out = tc.batch_norm(tc.zeros(0, 3), mean, var, training=True)   # torch leaves them too
    assert out.shape == (0, 3)
    np.testing.assert_array_equal(mean.numpy(), before)


def test_running_stats_that_require_grad_are_refused_as_in_torch():
    mean = tc.tensor(MEAN, requires_grad=True)
    with pytest.raises(tc.TracecompError, match="in-place"):
        tc.batch_norm(tc.tensor(X), mean, tc.tensor(VAR), training=True)


@pytest.mark.parametrize("padding_idx", [2, -3])
def test_the_padding_row_gets_no_gradient_as_in_torch(padding_idx):
    weight = rng.standard_normal((5, 3))
    indices = np.array([[0, 2, 2], [4, 0, 1]])
    tw = torch.tensor(weight, requires_grad=True)
    out = F.embedding(torch.tensor(indices), tw, padding_idx=padding_idx)
    cotangent = rng.standard_normal(out.shape)
    (out * torch.tensor(cotangent)).sum().backward()

    def loss(w, i):
        return (tc.embedding(i, w, padding_idx=padding_idx) * tc.tensor(cotangent)).sum()
    for grad in (tc.grad(loss), tc.trace(tc.grad(loss))):
        got = grad(tc.tensor(weight), tc.tensor(indices))
        np.testing.assert_allclose(got.numpy(), tw.grad.numpy(), rtol=1e-12)
    assert not np.any(tw.grad.numpy()[padding_idx])
    np.testing.assert_array_equal(tc.embedding(tc.tensor(indices), tc.tensor(weight), padding_idx=padding_idx).numpy(),
                                  out.detach().numpy())


def test_one_hot_infers_the_classes_eagerly_and_asks_for_them_when_traced():
    t = np.array([[1, 4], [0, 2]])
    np.testing.assert_array_equal(tc.one_hot(tc.tensor(t)).numpy(), F.one_hot(torch.tensor(t)).numpy())
    with pytest.raises(tc.TraceError, match="tc.one_hot .*pass num_classes"):
        tc.trace(lambda t: tc.one_hot(t))(t)
    np.testing.assert_array_equal(tc.trace(lambda t: tc.one_hot(t, 6))(t).numpy(), F.one_hot(torch.tensor(t), 6).numpy())
    with pytest.raises(tc.ShapeError, match="Can not infer total number of classes from empty tensor"):
        tc.one_hot(tc.tensor(np.zeros(0, np.int64)))
