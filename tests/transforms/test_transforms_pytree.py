"""Transforms over pytrees (JAX's convention): grad, value_and_grad, vjp and jvp take and give
nested dicts, lists, tuples and named tuples; checked against the same function on flat
tensors, and against torch.func where PyTorch is installed."""
from __future__ import annotations

import re

from collections import namedtuple

import numpy as np
import pytest

import tracecomp as tc

R = np.random.default_rng(0)
Pair = namedtuple("Pair", "a b")


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


PARAMS = {"w": f32(3, 2), "b": f32(2), "extra": [f32(2), Pair(f32(2), f32(1))], "off": None}
X = f32(4, 3)


def loss(p, x):
    h = (x @ p["w"] + p["b"]).tanh()
    a, b = p["extra"][1]
    return (h * h).mean() + (p["extra"][0] * h).sum() + (a * a).sum() * b.sum()


def flat_loss(w, b, e0, a, bb, x):
    return loss({"w": w, "b": b, "extra": [e0, Pair(a, bb)], "off": None}, x)


def leaves(g):
    return [g["w"], g["b"], g["extra"][0], g["extra"][1].a, g["extra"][1].b]


def assert_close(got, want, tol=1e-5):
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "traced"])
def test_grad_of_a_dict_has_the_dicts_structure(compiled):
    grad = tc.grad(loss)
    g = (tc.trace(grad) if compiled else grad)(PARAMS, X)
    assert set(g) == {"w", "b", "extra", "off"} and g["off"] is None
    assert isinstance(g["extra"], list) and isinstance(g["extra"][1], Pair)
    flat = tc.grad(flat_loss, argnums=(0, 1, 2, 3, 4))(*leaves(PARAMS), X)
    assert_close(leaves(g), flat)


def test_value_and_grad_with_argnums_over_pytrees_and_aux():
    def f(p, scale, xs):
        out = loss(p, xs[0]) * scale + (xs[1] ** 2).sum()
        return out, {"h": out * 2}
    xs = (X, f32(3))
    (value, aux), (gp, gx) = tc.value_and_grad(f, argnums=(0, 2), has_aux=True)(PARAMS, 2.0, xs)
    assert isinstance(gx, tuple) and len(gx) == 2
    np.testing.assert_allclose(aux["h"].numpy(), 2 * value.numpy(), rtol=1e-6)
    assert_close([gx[1]], [2 * xs[1]])
    assert_close(leaves(gp), [2 * np.asarray(v) for v in leaves(tc.grad(loss)(PARAMS, X))])


def test_matches_torch_func_grad_on_a_dict():
    torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle)")

    def torch_loss(p, x):
        h = torch.tanh(x @ p["w"] + p["b"])
        return (h * h).mean() + (p["v"] * h).sum()
    p = {"w": f32(3, 2), "b": f32(2), "v": f32(2)}
    want = torch.func.grad(torch_loss)({k: torch.from_numpy(v) for k, v in p.items()}, torch.from_numpy(X))

    def tc_loss(p, x):
        h = tc.tanh(x @ p["w"] + p["b"])
        return (h * h).mean() + (p["v"] * h).sum()
    got = tc.trace(tc.grad(tc_loss))(p, X)
    for k in p:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-6)


def test_vjp_and_jvp_over_pytrees():
    def f(p):
        return {"y": p["a"] * p["b"], "z": [p["a"].sin()]}
    p = {"a": f32(3), "b": f32(3)}
    out, vjp_fn = tc.vjp(f, p)
    assert set(out) == {"y", "z"} and not out["y"].requires_grad
    ct = {"y": np.ones(3, np.float32), "z": [np.full(3, 2.0, np.float32)]}
    (g,) = vjp_fn(ct)
    assert_close([g["a"], g["b"]], [p["b"] + 2 * np.cos(p["a"]), p["a"]])
    t = {"a": np.ones(3, np.float32), "b": np.zeros(3, np.float32)}
    primal_out, tangent_out = tc.jvp(f, (p,), (t,))
    assert_close([tangent_out["y"], tangent_out["z"][0]], [p["b"], np.cos(p["a"])])
    assert_close([primal_out["y"]], [p["a"] * p["b"]])


@pytest.mark.parametrize("bad, message", [
    ({"w": X, "name": "encoder"}, "argument 0['name'] is a str ('encoder'), not a tensor"),
    ({"w": X, "steps": 3}, "argument 0['steps'] is the Python int 3, but only floating-point inputs"),
    ([X, np.arange(3)], "argument 0[1] is a numpy.ndarray of dtype int64, but only floating-point"),
])
def test_errors_name_the_leafs_path(bad, message):
    with pytest.raises(tc.ArgumentError, match=re.escape(message)):
        tc.grad(lambda p: p["w"].sum() if isinstance(p, dict) else p[0].sum())(bad)


def test_jvp_structure_mismatch_is_an_error():
    with pytest.raises(tc.ArgumentError, match="same structure"):
        tc.jvp(lambda p: p["a"], ({"a": f32(2), "b": f32(2)},), ({"a": f32(2)},))
