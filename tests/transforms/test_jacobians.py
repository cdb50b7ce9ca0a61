"""tc.jacrev, tc.jacfwd and tc.hessian over pytrees, against torch.func (PyTorch's own
functional transforms) and against each other; eager and under tc.trace."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch")
rng = np.random.default_rng(3)
W, B, X = rng.standard_normal((3, 2)), rng.standard_normal(2), rng.standard_normal((4, 3))


def _np(tree):
    if isinstance(tree, dict):
        return {k: _np(v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_np(v) for v in tree)
    return tree.detach().numpy() if hasattr(tree, "detach") else tree.numpy()


def _close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def layer(lib):
    return lambda p, x: lib.tanh(x @ p["w"] + p["b"])


def two_outputs(lib):
    return lambda a, b: (lib.sin(a) * b.sum(), (a * a).sum() + b[0])


CASES = [
    ("dict params", layer, ({"w": W, "b": B}, X), 0),
    ("both arguments", layer, ({"w": W, "b": B}, X[:2]), (0, 1)),
    ("two outputs", two_outputs, (X[0], B), (0, 1)),
]


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd"])
@pytest.mark.parametrize("name, make, args, argnums", CASES, ids=[c[0] for c in CASES])
def test_jacobians_match_torch_func(transform, name, make, args, argnums):
    want = _np(getattr(torch.func, transform)(make(torch), argnums=argnums)(
        *[{k: torch.tensor(v) for k, v in a.items()} if isinstance(a, dict) else torch.tensor(a) for a in args]))
    got = getattr(tc, transform)(make(tc), argnums=argnums)(*args)
    _close(_np(got), want)
    traced = tc.trace(getattr(tc, transform)(make(tc), argnums=argnums))(*args)
    _close(_np(traced), want)


def test_hessian_matches_torch_func():
    def loss(lib):
        return lambda p, x: (lib.tanh(x @ p["w"] + p["b"]) ** 2).sum()
    want = _np(torch.func.hessian(loss(torch))({"w": torch.tensor(W), "b": torch.tensor(B)}, torch.tensor(X)))
    _close(_np(tc.hessian(loss(tc))({"w": W, "b": B}, X)), want)
    _close(_np(tc.trace(tc.hessian(loss(tc)))({"w": W, "b": B}, X)), want)


def test_has_aux_returns_the_aux_beside_the_jacobian():
    jac, aux = tc.jacrev(lambda x: (x * 2, x.sum()), has_aux=True)(np.ones(3))
    np.testing.assert_array_equal(jac.numpy(), 2 * np.eye(3))
    assert aux.item() == 3.0
    jac, aux = tc.jacfwd(lambda x: (x * 2, "label"), has_aux=True)(np.ones(3))
    np.testing.assert_array_equal(jac.numpy(), 2 * np.eye(3))
    assert aux == "label"


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd", "hessian"])
def test_the_basis_is_one_vmap_not_a_loop(transform):
    """The traced graph has as many ops for 3 inputs as for 12: the unit vectors are one
    batched program, not unrolled."""
    def f(x):
        return (tc.tanh(x) * x.sum()).sum() if transform == "hessian" else tc.tanh(x) * x.sum()
    sizes = [len(tc.trace(getattr(tc, transform)(f)).lower(np.linspace(0.1, 1, n)).graph.ops) for n in (3, 12)]
    assert sizes[0] == sizes[1]
    x = np.linspace(0.1, 1, 5)
    got = tc.trace(getattr(tc, transform)(f))(x)
    want = getattr(torch.func, transform)(lambda t: (torch.tanh(t) * t.sum()).sum() if transform == "hessian"
                                          else torch.tanh(t) * t.sum())(torch.tensor(x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
