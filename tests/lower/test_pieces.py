"""Loops split where a select's condition changes (schedule/pieces.py): cat, sums of
slice_backward and other piecewise stores compute one piece per loop, no selects left,
and the values are unchanged (compiled, and through the loop-IR interpreter)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracecomp as tc
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.interp import run_program
from tracecomp.lower.loops.walk import walk
from tracecomp.lower.schedule.pieces import MAX_PIECES
from tracecomp.lower.schedule.scheduler import schedule


def _program(fn, *inputs):
    return schedule(tc.trace(fn).lower(*inputs).optimized)


def _selects(program) -> int:
    return sum(isinstance(n, L.Select) for k in program.kernels for n in walk(k.body))


def _check(fn, inputs, want):
    program = _program(fn, *inputs)
    got_interp = run_program(program, [np.asarray(a) for a in inputs])[0]
    got = np.asarray(tc.trace(fn)(*inputs))
    np.testing.assert_array_equal(got_interp, want)
    np.testing.assert_array_equal(got, want)
    return program


@settings(max_examples=25, deadline=None)
@given(widths=st.lists(st.integers(1, 40), min_size=2, max_size=MAX_PIECES), rows=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_cat_along_the_last_dim_has_no_selects(widths, rows, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((rows, w)).astype(np.float32) for w in widths]

    def fn(*xs):
        return tc.cat([x * 2.0 + 1.0 for x in xs], dim=1)
    program = _check(fn, parts, np.concatenate([p * np.float32(2) + np.float32(1) for p in parts], axis=1))
    assert _selects(program) == 0


def test_gradient_assembled_from_slices_has_no_selects():
    """An LSTM's pattern: four gate slices of one row, each through its own function; the
    gradient places each slice's gradient into the row (sums of slice_backward)."""
    x = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float64)

    def loss(x):
        return (tc.sigmoid(x[:, :10]).sum() + tc.tanh(x[:, 10:20]).sum()
                + (x[:, 20:30] * x[:, 20:30]).sum() + tc.exp(x[:, 30:]).sum())
    fn = tc.grad(loss)
    s = 1 / (1 + np.exp(-x[:, :10]))
    want = np.concatenate([s * (1 - s), 1 - np.tanh(x[:, 10:20]) ** 2, 2 * x[:, 20:30], np.exp(x[:, 30:])], axis=1)
    program = _program(fn, x)
    assert _selects(program) == 0
    np.testing.assert_allclose(np.asarray(tc.trace(fn)(x)), want, rtol=1e-13)
    np.testing.assert_allclose(run_program(program, [x])[0], want, rtol=1e-13)


@pytest.mark.parametrize("step", [2, 3])
def test_strided_slice_gradient_keeps_its_test(step):
    """A slice with a step leaves every other element zero: the split folds the range
    tests, the remainder test stays."""
    x = np.arange(1.0, 25.0).reshape(2, 12)
    fn = tc.grad(lambda x: (x[:, 1:9:step] * x[:, 1:9:step]).sum())
    want = np.zeros_like(x)
    want[:, 1:9:step] = 2 * x[:, 1:9:step]
    np.testing.assert_array_equal(np.asarray(tc.trace(fn)(x)), want)


def test_more_pieces_than_the_limit_stay_one_loop():
    parts = [np.full((2, 3), float(i), np.float32) for i in range(MAX_PIECES + 2)]
    program = _check(lambda *xs: tc.cat([x + 1.0 for x in xs], dim=1), parts,
                     np.concatenate(parts, axis=1) + np.float32(1))
    assert _selects(program) > 0
