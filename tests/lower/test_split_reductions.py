"""Reductions over dims that end in the input's last dims and include others besides
(BatchNorm's (0, 2, 3) of NCHW): an outer Reduce around one over the contiguous rows
(schedule/reductions.py `_split`), checked against NumPy in float64, statically and with
dynamic sizes, for every reduction that splits."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.loops import ir as L
from tracecomp.lower.schedule.scheduler import schedule

CASES = [((3, 4, 5, 6), (0, 2, 3)), ((3, 4, 5, 6), (0, 3)), ((2, 3, 4, 5), (0, 1, 3)), ((7, 2, 9), (0, 2))]
OPS = {
    "sum": (lambda x, d: tc.sum(x, d, keepdim=True), lambda x, d: x.sum(d, keepdims=True)),
    "mean": (lambda x, d: tc.mean(x, d), lambda x, d: x.mean(d)),
    "var": (lambda x, d: tc.var(x, d, correction=0, keepdim=True), lambda x, d: x.var(d, keepdims=True)),
    "std": (lambda x, d: tc.std(x, d), lambda x, d: x.std(d, ddof=1)),
    "amax": (lambda x, d: tc.amax(x, d), lambda x, d: x.max(d)),
    "amin": (lambda x, d: tc.amin(x, d, keepdim=True), lambda x, d: x.min(d, keepdims=True)),
}


def _nested_reduces(kernels) -> int:
    found = 0

    def walk(body, inside):
        nonlocal found
        for s in body:
            if isinstance(s, L.Reduce):
                found += inside
                walk(s.body, True)
            elif hasattr(s, "body") and isinstance(s.body, list):
                walk(s.body, inside)
    for k in kernels:
        walk(k.body, False)
    return found


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("shape,dims", CASES)
def test_split_reductions_match_numpy(name, shape, dims):
    fn, ref = OPS[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) + 0.5
    got = np.asarray(tc.trace(lambda x: fn(x, dims))(x))
    np.testing.assert_allclose(got, ref(x.astype(np.float64), dims), rtol=2e-5, atol=2e-6)


def test_batch_norm_statistics_read_rows_in_an_inner_loop():
    x = np.ones((4, 3, 5, 6), np.float32)
    kernels = schedule(tc.trace(lambda x: tc.mean(x, (0, 2, 3))).lower(x).optimized).kernels
    assert _nested_reduces(kernels) == 1
    # a reduction over the last dims only stays one flat Reduce
    kernels = schedule(tc.trace(lambda x: tc.sum(x, (2, 3))).lower(x).optimized).kernels
    assert _nested_reduces(kernels) == 0


def test_split_reductions_take_dynamic_sizes():
    rng = np.random.default_rng(1)
    f = tc.trace(lambda x: (tc.mean(x, (0, 2, 3)), tc.var(x, (0, 2, 3), correction=0)), dynamic=True)
    for shape in ((2, 3, 4, 5), (5, 3, 7, 2)):
        x = rng.standard_normal(shape).astype(np.float32)
        mean, var = f(x)
        np.testing.assert_allclose(np.asarray(mean), x.astype(np.float64).mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(var), x.astype(np.float64).var((0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_split_sums_of_many_terms_stay_accurate():
    """32 rows of 65536 float32 terms per channel: the rows' partial sums are combined in
    the outer loop; the result must stay near the float64 sum."""
    x = np.random.default_rng(2).uniform(0, 1, (32, 2, 256, 256)).astype(np.float32)
    got = np.asarray(tc.trace(lambda x: tc.sum(x, (0, 2, 3)))(x))
    np.testing.assert_allclose(got, x.astype(np.float64).sum((0, 2, 3)), rtol=1e-6)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape,dim", [((3, 5, 7), 1), ((4, 6), 0), ((2, 9, 3, 4), 1), ((2, 3, 4, 5), 2)])
def test_column_max_and_min_dim_take_the_first_extreme(op, shape, dim):
    """max.dim/min.dim over a dim with kept inner dims (a max-pool's window axis) update
    both outputs row by row (scheduler._column_arg_reduction): the first extreme wins,
    and the first NaN, as torch.max/min; no Reduce is left in the kernel."""
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, shape).astype(np.float32)       # many ties
    x.flat[::7] = np.nan
    fn = (lambda x: tc.max(x, dim)) if op == "max" else (lambda x: tc.min(x, dim))
    values, indices = tc.trace(fn)(x)
    torch = pytest.importorskip("torch")
    want = getattr(torch, op)(torch.from_numpy(x), dim)
    np.testing.assert_array_equal(np.asarray(values), want.values.numpy())
    np.testing.assert_array_equal(np.asarray(indices), want.indices.numpy())
    kernels = schedule(tc.trace(fn).lower(x).optimized).kernels
    assert not any(isinstance(s, L.Reduce) for k in kernels for s in _statements(k.body))


def test_column_max_dim_takes_dynamic_sizes():
    f = tc.trace(lambda x: tc.max(x, 1), dynamic=True)
    for shape in ((2, 5, 3), (4, 2, 9)):
        x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
        values, indices = f(x)
        np.testing.assert_array_equal(np.asarray(values), x.max(1))
        np.testing.assert_array_equal(np.asarray(indices), x.argmax(1))


def _statements(body):
    for s in body:
        yield s
        if isinstance(getattr(s, "body", None), list):
            yield from _statements(s.body)
