"""roll, diagonal, reflect/replicate/circular pad and slice_scatter with every dim dynamic
(issue 36): one compile for every size, values and gradients against eager tracecomp.

roll's shift modulo a run-time length and pad's source positions are index arithmetic in
the kernel; diagonal's strided slice has the step n + 1 of a dynamic n, whose length the
size algebra divides out exactly (symbolic long division, tested in
tests/core/test_symbolic_division.py); a strided slice_scatter's src has the length
(n + 1) // 2 of a dynamic n, an equality of sizes kept as guards.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

SHAPES = [(5, 7), (6, 9), (9, 13)]          # rows < columns throughout: one side of every guard


def _check(fn, make, shapes=SHAPES, grad=True):
    f = tc.trace(fn, dynamic=True)
    g = tc.trace(tc.grad(lambda x: (fn(x) ** 2).sum()), dynamic=True) if grad else None
    for shape in shapes:
        x = make(shape)
        np.testing.assert_allclose(np.asarray(f(x)), np.asarray(fn(tc.tensor(x))), err_msg=str(shape))
        if g is not None:
            want = tc.grad(lambda x: (fn(x) ** 2).sum())(tc.tensor(x))
            np.testing.assert_allclose(np.asarray(g(x)), np.asarray(want), rtol=1e-6, err_msg=str(shape))
    assert len(f.signatures) == 1, f.signatures
    assert g is None or len(g.signatures) == 1, g.signatures


def _floats(shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("fn", [
    lambda x: tc.roll(x, 3, 1),
    lambda x: tc.roll(x, -8, 0),                     # a shift longer than the dim, negative
    lambda x: tc.roll(x, [2, -1], [0, 1]),
    lambda x: tc.roll(x, 17),                        # flattened: the length is rows * columns
], ids=["columns", "rows-negative", "both", "flat"])
def test_roll_by_a_shift_modulo_a_dynamic_length(fn):
    _check(fn, _floats)


@pytest.mark.parametrize("fn", [
    lambda x: tc.diagonal(x),
    lambda x: tc.diagonal(x, 2),
    lambda x: tc.diagonal(x, -1),
    lambda x: tc.diagonal(x.reshape(x.shape[0], 1, x.shape[1]), 0, 2, 0),
], ids=["main", "above", "below", "dims"])
def test_diagonal_of_dynamic_sizes(fn):
    _check(fn, _floats)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_of_dynamic_sizes(mode):
    _check(lambda x: tc.pad(x.reshape(1, *x.shape), (2, 1, 1, 3), mode), _floats)


def test_pad_of_a_dynamic_int_tensor():
    ints = lambda shape: np.arange(np.prod(shape), dtype=np.int64).reshape(shape)   # noqa: E731
    _check(lambda x: tc.pad(x, (3, 2), "reflect"), ints, grad=False)


def test_slice_scatter_with_a_step_into_a_dynamic_dim():
    f = tc.trace(lambda t, v: tc.slice_scatter(t, v, 1, 1, None, 2), dynamic=True)
    g = tc.trace(tc.grad(lambda t, v: (tc.slice_scatter(t, v, 1, 1, None, 2) ** 2).sum(), (0, 1)), dynamic=True)
    for rows, n in [(3, 5), (4, 6), (5, 9), (7, 40)]:
        t, v = _floats((rows, n)), _floats((rows, n // 2)) + 1
        want = t.copy()
        want[:, 1::2] = v
        np.testing.assert_array_equal(np.asarray(f(t, v)), want)
        for got, expect in zip(g(t, v), tc.grad(lambda t, v: (tc.slice_scatter(t, v, 1, 1, None, 2) ** 2).sum(),
                                                  (0, 1))(tc.tensor(t), tc.tensor(v))):
            np.testing.assert_allclose(np.asarray(got), np.asarray(expect))
    assert len(f.signatures) == 1 and len(g.signatures) == 1, (f.signatures, g.signatures)
    with pytest.raises(tc.TracecompError, match="slicing dim 1"):      # src one too long: no compile serves it
        f(_floats((4, 7)), _floats((4, 4)))
