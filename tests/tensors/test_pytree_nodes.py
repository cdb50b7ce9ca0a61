"""Registered classes in pytrees (JAX's register_pytree_node): tc.grad, tc.jacrev and
tc.trace take and return them; their aux data is part of the trace signature."""
from __future__ import annotations

import numpy as np

import tracecomp as tc


class Linear:
    def __init__(self, w, b, name="linear"):
        self.w, self.b, self.name = w, b, name

    def __call__(self, x):
        return x @ self.w + self.b


tc.register_pytree_node(Linear, lambda m: ((m.w, m.b), m.name), lambda name, ch: Linear(*ch, name=name))

rng = np.random.default_rng(0)
W, B, X = rng.standard_normal((3, 2)), rng.standard_normal(2), rng.standard_normal((4, 3))


def loss(m, x):
    return (tc.tanh(m(x)) ** 2).sum()


def test_grad_returns_the_class_with_gradients_inside():
    g = tc.grad(loss)(Linear(W, B), X)
    assert isinstance(g, Linear) and g.name == "linear"
    d = tc.grad(lambda p, x: loss(Linear(p["w"], p["b"]), x))({"w": W, "b": B}, X)
    np.testing.assert_allclose(g.w.numpy(), d["w"].numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.b.numpy(), d["b"].numpy(), rtol=1e-12)


def test_traced_step_takes_and_returns_the_class():
    @tc.trace
    def step(m, x):
        g = tc.grad(loss)(m, x)
        return Linear(m.w - 0.1 * g.w, m.b - 0.1 * g.b, m.name)
    new = step(Linear(W, B), X)
    assert isinstance(new, Linear) and new.name == "linear"
    again = step(new, X)            # same signature: no retrace
    assert len(step._history) == 1 and isinstance(again, Linear)
    step(Linear(W, B, name="other"), X)          # the aux is part of the signature
    assert len(step._history) == 2


def test_jacrev_over_a_registered_class():
    jac = tc.jacrev(lambda m, x: m(x))(Linear(W, B), X[:1])
    assert isinstance(jac, Linear) and tuple(jac.w.shape) == (1, 2, 3, 2)
