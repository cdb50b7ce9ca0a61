"""Eager autograd engine semantics (seeds 002/004) and the functional API (JAX conventions)."""
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.autograd import AutogradError

rng = np.random.default_rng(0)


def leaf(*shape):
    return tc.tensor(rng.standard_normal(shape), requires_grad=True)


def test_grad_fn_names_and_next_functions_follow_pytorch():
    a, b = leaf(3), leaf(3)
    q = 3 * a ** 3 - b ** 2
    assert type(q.grad_fn).__name__ == "SubBackward0"
    (left, _), (right, _) = q.grad_fn.next_functions
    assert type(left).__name__ == "MulBackward0" and type(right).__name__ == "PowBackward0"
    assert type(right.next_functions[0][0]).__name__ == "AccumulateGrad"
    assert right.next_functions[0][0].variable is b
    assert a.is_leaf and not q.is_leaf and q.requires_grad


def test_backward_accumulates_into_leaves_across_calls():
    x = leaf(4)
    (x * x).sum().backward()
    first = x.grad.numpy().copy()
    np.testing.assert_allclose(first, 2 * x.numpy())
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first)


def test_second_backward_through_freed_graph_raises():
    a = tc.tensor(2.0, requires_grad=True)
    q = 3 * a ** 3
    q.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        q.backward()


def test_retain_graph_allows_a_second_backward():
    a = tc.tensor(2.0, requires_grad=True)
    q = 3 * a ** 3
    q.backward(retain_graph=True)
    q.backward()
    assert a.grad.item() == pytest.approx(2 * 36.0)


def test_backward_of_non_scalar_needs_gradient():
    x = leaf(3)
    y = x * 2
    with pytest.raises(tc.ArgumentError, match="only for scalar outputs"):
        y.backward()
    y.backward(gradient=tc.tensor(np.ones(3)))
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.ones(3))


def test_no_grad_detach_and_requires_grad():
    x = leaf(3)
    with tc.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = x.detach()
    assert not z.requires_grad and z.is_leaf and np.shares_memory(z.numpy(), x.numpy())
    assert not (tc.ones(3) * 2).requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()
    with pytest.raises(tc.DTypeError, match="only floating point"):
        tc.ones(2, dtype=tc.int64).requires_grad_()


def test_retain_grad_keeps_non_leaf_gradients():
    x = leaf(3)
    y = x * 3
    y.retain_grad()
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 2 * y.numpy())
    assert (x * 2).grad is None


def test_unused_branches_get_no_gradient_and_only_needed_inputs_are_computed():
    x, w = leaf(3), tc.tensor(rng.standard_normal(3))      # w does not require grad
    y = (x * w).sum()
    node = y.grad_fn.next_functions[0][0]                    # MulBackward0
    assert node.next_functions[1] == (None, 0)               # no edge for w
    y.backward()
    assert w.grad is None
    np.testing.assert_allclose(x.grad.numpy(), w.numpy())


def test_broadcasting_is_undone_in_backward():
    x, b = leaf(4, 3), leaf(3)
    (x * b + b).sum().backward()
    assert b.grad.shape == (3,)
    np.testing.assert_allclose(b.grad.numpy(), x.numpy().sum(0) + 4)


def test_functional_grad_value_and_grad_argnums_and_aux():
    def f(x, y):
        return (x * y).sum() + (x * x).sum()

    x, y = rng.standard_normal(3), rng.standard_normal(3)
    gx = tc.grad(f)(x, y)
    np.testing.assert_allclose(np.asarray(gx), y + 2 * x)
    value, (gx, gy) = tc.value_and_grad(f, argnums=(0, 1))(x, y)
    assert value.item() == pytest.approx(float((x * y).sum() + (x * x).sum()))
    np.testing.assert_allclose(np.asarray(gy), x)
    (value, aux), g = tc.value_and_grad(lambda x: ((x * x).sum(), x * 2), has_aux=True)(x)
    np.testing.assert_allclose(np.asarray(aux), 2 * x)


@pytest.mark.parametrize("call, match", [
    (lambda: tc.grad(lambda x: x * 2)(np.ones(3)), "scalar"),
    (lambda: tc.grad(lambda x: x.sum(), argnums=2)(np.ones(3)), "argnums 2 is out of range"),
    (lambda: tc.grad(lambda x: x.sum())(np.ones(3, np.int64)), "only floating-point inputs can be differentiated"),
    (lambda: tc.jvp(lambda x: x, (np.ones(3),), (np.ones(2),)), "must match"),
])
def test_functional_api_errors(call, match):
    with pytest.raises(tc.ArgumentError, match=match):
        call()


def test_vjp_and_jvp():
    x = rng.standard_normal(4)
    out, pull = tc.vjp(lambda x: tc.sin(x) * x, x)
    ct = rng.standard_normal(4)
    (g,) = pull(ct)
    np.testing.assert_allclose(np.asarray(g), ct * (np.cos(x) * x + np.sin(x)))
    out, tangent = tc.jvp(lambda x: tc.sin(x) * x, (x,), (ct,))
    np.testing.assert_allclose(np.asarray(tangent), ct * (np.cos(x) * x + np.sin(x)))


def test_higher_order_eager_and_traced():
    f = lambda x: (tc.sin(x) * x).sum()          # noqa: E731
    x = rng.standard_normal(3)
    d2 = -np.sin(x) * x + 2 * np.cos(x)          # diagonal Hessian
    hess_diag = tc.grad(lambda x: tc.grad(f)(x).sum())
    np.testing.assert_allclose(np.asarray(hess_diag(x)), d2, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(tc.trace(hess_diag)(x)), d2, rtol=1e-10)
    v = rng.standard_normal(3)
    _, hvp = tc.jvp(tc.grad(f), (x,), (v,))
    np.testing.assert_allclose(np.asarray(hvp), d2 * v, rtol=1e-10)
    _, hvp_traced = tc.trace(lambda x, v: tc.jvp(tc.grad(f), (x,), (v,)))(x, v)
    np.testing.assert_allclose(np.asarray(hvp_traced), d2 * v, rtol=1e-10)
    grad_of_gv = tc.grad(lambda x: (tc.grad(f)(x) * v).sum())(x)
    np.testing.assert_allclose(np.asarray(grad_of_gv), d2 * v, rtol=1e-10)


def _mlp_loss(w1, b1, w2, b2, x, target):
    h = tc.relu(x @ w1 + b1)
    return tc.cross_entropy(h @ w2 + b2, target)


def _numpy_mlp_grads(w1, b1, w2, b2, x, target):
    """The hand-written backward pass of a 2-layer MLP with softmax cross-entropy."""
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    n = x.shape[0]
    dlogits = p.copy()
    dlogits[np.arange(n), target] -= 1
    dlogits /= n
    dw2, db2 = h.T @ dlogits, dlogits.sum(0)
    dpre = (dlogits @ w2.T) * (pre > 0)
    return x.T @ dpre, dpre.sum(0), dw2, db2


def test_mlp_gradients_match_a_hand_written_backward_pass():
    w1, b1 = rng.standard_normal((6, 5)), rng.standard_normal(5)
    w2, b2 = rng.standard_normal((5, 3)), rng.standard_normal(3)
    x, target = rng.standard_normal((8, 6)), rng.integers(0, 3, 8)
    expected = _numpy_mlp_grads(w1, b1, w2, b2, x, target)
    step = tc.value_and_grad(_mlp_loss, argnums=(0, 1, 2, 3))
    for run in (step, tc.trace(step)):
        _, grads = run(w1, b1, w2, b2, x, target)
        for g, e in zip(grads, expected):
            np.testing.assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12)
    params = [tc.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
    _mlp_loss(*params, tc.tensor(x), tc.tensor(target)).backward()
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.grad.numpy(), e, rtol=1e-10, atol=1e-12)


def test_traced_value_and_grad_is_one_graph_with_forward_and_backward():
    step = tc.trace(tc.value_and_grad(_mlp_loss, argnums=(0, 1, 2, 3)))
    args = (rng.standard_normal((6, 5)), rng.standard_normal(5), rng.standard_normal((5, 3)),
            rng.standard_normal(3), rng.standard_normal((8, 6)), rng.integers(0, 3, 8))
    lowered = step.lower(*args)
    assert len(lowered.graph.outputs) == 5            # loss and four gradients
    backward = lowered.as_text("backward")
    assert "tc.matmul" in backward and "test_autograd.py" in backward
    from tracecomp.ir.parser import parse_graph
    parse_graph(backward)


def test_gradcheck_reports_the_worst_element():
    assert tc.gradcheck(lambda x: x * x, [rng.standard_normal(3)])
    with pytest.raises(tc.GradcheckError, match=r"input 0 at element \(\d,\), output element \d: analytic"):
        tc.gradcheck(lambda x: x.detach() * x, [rng.standard_normal(3)])   # hides half the gradient
    with pytest.raises(tc.GradcheckError, match="float64"):
        tc.gradcheck(lambda x: x * x, [rng.standard_normal(3).astype(np.float32)])
