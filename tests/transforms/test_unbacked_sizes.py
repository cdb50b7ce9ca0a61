"""Value-dependent sizes under tc.trace (issue 36; library/unbacked.py, transforms/staging.py).

Each traced function is compiled once (one signature) and called with values that select
different numbers of elements, 0 and all included; results are compared with eager
tracecomp and NumPy, gradients with eager's."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracecomp as tc

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 4)).astype(np.float32)
MASKS = [RNG.random((5, 4)) < 0.4, np.zeros((5, 4), bool), np.ones((5, 4), bool), RNG.random((5, 4)) < 0.8]


def _leaves(out) -> list[np.ndarray]:
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def _same(got, want, atol=1e-5):
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-5)


def _check_once(fn, argsets):
    """fn traced matches fn eager at every argument set, from one compile."""
    f = tc.trace(fn)
    for args in argsets:
        _same(f(*args), fn(*[tc.tensor(a) for a in args]))
    assert len(f.signatures) == 1
    return f


def test_mask_read_sum_and_elementwise_compile_once():
    def fn(x, m):
        s = x[m]
        return s.sum(), s * 2, s.exp().sum(), tc.cat([s, x[0]])
    f = _check_once(fn, [(X, m) for m in MASKS])
    for m in MASKS:                 # NumPy as the reference too
        np.testing.assert_allclose(np.asarray(f(X, m)[1]), X[m] * 2, rtol=1e-6)


def test_mean_matmul_and_broadcast_over_the_selection():
    w = RNG.standard_normal((1, 3)).astype(np.float32)

    def fn(x, m, w):
        s = x[m].reshape(-1, 1) * w
        return s.T @ s, s.sum(0)
    _check_once(fn, [(X, m, w) for m in MASKS])
    f = tc.trace(lambda x, m: x[m].mean())
    for m in MASKS[::3]:
        np.testing.assert_allclose(np.asarray(f(X, m)), X[m].mean(), rtol=1e-5)


def test_a_mask_computed_in_the_function_and_a_step_on_a_step():
    """The mask's producers run as a stage of their own; nonzero of unique's values takes
    a count from a count."""
    xs = [X, -np.abs(X), np.abs(X) + 1]
    _check_once(lambda x: (x[x > 0].sum(), tc.nonzero(x > 0.5), tc.softmax(x[x > 0], 0)), [(x,) for x in xs])
    _check_once(lambda v: tc.nonzero(tc.unique(v) > 2), [(RNG.integers(0, k, 8),) for k in (2, 5, 9)])
    _check_once(tc.value_and_grad(lambda x: (x[x > 0] ** 2).sum()), [(x,) for x in xs])


def test_nonzero_its_rows_index_and_as_tuple():
    _check_once(lambda m: tc.nonzero(m), [(m,) for m in MASKS])
    _check_once(lambda x, m: (lambda nz: x[nz[:, 0], nz[:, 1]] + 1)(tc.nonzero(m)), [(X, m) for m in MASKS])
    _check_once(lambda x, m: x[tc.nonzero(m, as_tuple=True)] * 2, [(X, m) for m in MASKS])
    f = tc.trace(lambda m: tc.argwhere(m))
    for m in MASKS:
        np.testing.assert_array_equal(np.asarray(f(m)), np.argwhere(m))


def test_masked_select_broadcasts_its_mask():
    _check_once(lambda x, m: tc.masked_select(x, m) - 1, [(X, m[0]) for m in MASKS])


def test_unique_sorted_with_inverse_and_counts():
    _check_once(lambda v: tc.unique(v, return_inverse=True, return_counts=True),
                    [(RNG.integers(0, k, (3, 4)),) for k in (3, 1, 12, 40)])
    v = np.array([5, 1, 5, 2, 2, 2])
    for got, want in zip(tc.trace(lambda v: tc.unique(v, return_counts=True))(v),
                         np.unique(v, return_counts=True)):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_repeat_interleave_with_tensor_repeats():
    _check_once(lambda v, r: tc.repeat_interleave(v, r) * 2, [(X[0], RNG.integers(0, k, 4)) for k in (3, 1, 6)])
    _check_once(lambda v, r: tc.repeat_interleave(v, r, dim=1), [(X, RNG.integers(0, k, 4)) for k in (3, 1)])


def test_tensor_split_at_a_tensor_of_points():
    _check_once(lambda v, i: tc.tensor_split(v, i), [(X, np.array(p)) for p in ([1, 3], [0, 5], [4, 2], [-1, 7])])


GRADS = {
    "x[mask]": (lambda x, m: (x[m] ** 2).sum(), lambda m: m),
    "masked_select": (lambda x, m: (tc.masked_select(x, m) * 3).sum(), lambda m: m[0]),
    "repeat_interleave": (lambda x, r: (tc.repeat_interleave(x, r, dim=0) ** 2).sum(),
                          lambda m: m.sum(1).astype(np.int64)),
    "tensor_split": (lambda x, i: sum(((k + 1) * p).sum() for k, p in enumerate(tc.tensor_split(x, i, dim=1))),
                     lambda m: np.sort(m.sum(0))[:2].astype(np.int64)),
}


@pytest.mark.parametrize("name", GRADS)
def test_gradients_match_eager(name):
    loss, arg = GRADS[name]
    _check_once(tc.value_and_grad(loss), [(X, arg(m)) for m in MASKS])


def test_gradient_of_mask_read_against_finite_differences():
    x, m = X.astype(np.float64), MASKS[0]
    g = np.asarray(tc.trace(tc.grad(lambda x, m: (x[m] ** 3).sum()))(x, m))
    np.testing.assert_allclose(g, np.where(m, 3 * x ** 2, 0), rtol=1e-10)


def test_an_empty_selection_refuses_max_as_eager_does():
    f = tc.trace(lambda x, m: x[m].max())
    np.testing.assert_allclose(np.asarray(f(X, MASKS[2])), X.max())
    with pytest.raises(tc.ShapeError, match="max: cannot reduce over an empty dim") as e:
        f(X, MASKS[1])
    assert "test_unbacked_sizes.py" in str(e.value)


def test_an_op_that_needs_the_size_as_a_number_names_it_and_the_line():
    with pytest.raises(tc.TracecompError, match=r"mask_0") as e:
        tc.trace(lambda x, m: x[m].reshape(2, -1))(X, MASKS[2])
    assert "test_unbacked_sizes.py" in str(e.value) and "reshape" in str(e.value)


def test_one_selection_made_twice_has_one_size():
    _check_once(lambda x, m: tc.stack([x[m], x[m] + 1, x[tc.nonzero(m, as_tuple=True)]]),
                [(X, m) for m in MASKS])


def test_two_selections_have_two_sizes():
    """Two value-dependent sizes are not assumed equal (PyTorch's unbacked sizes neither)."""
    with pytest.raises(tc.TracecompError, match="nonzero_0.*nonzero_1|broadcast"):
        tc.trace(lambda x, m: tc.nonzero(m)[:, 0] + tc.nonzero(m > 0)[:, 1])(X, MASKS[0])


def test_inside_a_loop_body_the_op_still_raises_naming_it():
    def body(c, m):
        return c + tc.masked_select(X[0], m).sum(), c
    with pytest.raises(tc.TraceError, match=r"tc.masked_select .*not inside a loop.*tc.where") as e:
        tc.trace(lambda ms: tc.scan(body, tc.tensor(np.float32(0)), ms))(np.ones((3, 4), bool))
    assert "test_unbacked_sizes.py" in str(e.value)


def test_forms_whose_count_of_results_depends_on_values_are_refused():
    with pytest.raises(tc.TraceError, match=r"tensor_split under tc.trace: a 0-d tensor of sections") as e:
        tc.trace(lambda x, n: tc.tensor_split(x, n))(X, np.array(2))
    assert "test_unbacked_sizes.py" in str(e.value)
    with pytest.raises(tc.TraceError, match=r"tc.unique .*dim=None"):
        tc.trace(lambda v: tc.unique(v, dim=0))(np.array([[1, 2], [1, 2]]))


@settings(max_examples=15, deadline=None)
@given(density=st.floats(0, 1), rows=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_hypothesis_mask_densities_match_numpy(density, rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 3)).astype(np.float32)
    m = rng.random((rows, 3)) < density
    got = _FN(x, m)
    np.testing.assert_allclose(np.asarray(got[0]), x[m] * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[1]), x[m].sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got[2]), np.argwhere(m))


_FN = tc.trace(lambda x, m: (x[m] * 2 + 1, x[m].sum(), tc.nonzero(m)), dynamic=True)


def test_assigning_a_selection_into_its_mask_and_its_gradient():
    def fn(x, m):
        y = x * 1.0
        y[m] = x[m] * 2          # the value's size is the index's: one step, one size
        return y
    _check_once(fn, [(X, m) for m in MASKS])
    _check_once(tc.grad(lambda x, m: (fn(x, m) ** 2).sum()), [(X, m) for m in MASKS])
