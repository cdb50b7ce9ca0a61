"""Sorting and searching along a dynamic length (issue 36): one compile serves every length.

The dynamic sort unrolls the passes of the example length and 4 more, and runs any further
ones in a loop of pairs with run-time widths (schedule/sort.py); the lengths below cross
those counts from several example lengths (both parities of the pass count, lengths past
16x the example's), against NumPy's stable sort.  Gradients of the sort family with
dynamic sizes against eager tracecomp.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.dtypes import DType
from tracecomp.core.errors import IRError
from tracecomp.lower.loops.check import check_kernel
from tracecomp.lower.loops.interp import LoopInterpreter
from tracecomp.lower.loops.ir import INDEX, Accumulator, Binary, Buffer, Cast, Const, Kernel, Let, Reduce, Store, Var

LENGTHS = [2, 3, 4, 5, 8, 9, 31, 32, 33, 64, 65, 128, 129, 257, 600, 1025, 4099]


def _rows(n: int, rng) -> np.ndarray:
    x = rng.standard_normal((6, n)).astype(np.float32)     # (no length is 6: one shape class)
    x[1] = np.round(x[1])                 # ties: the order must stay stable
    x[2, ::7] = np.nan                    # NaN sorts last
    return x


@pytest.mark.parametrize("first", [3, 8, 40])
def test_argsort_along_a_dynamic_length_compiles_once(first):
    rng = np.random.default_rng(first)
    f = tc.trace(lambda a: tc.argsort(a, -1), dynamic=True)
    for n in [first] + LENGTHS:
        x = _rows(n, rng)
        np.testing.assert_array_equal(np.asarray(f(x)), np.argsort(x, -1, kind="stable"), err_msg=f"n = {n}")
    assert len(f.signatures) == 1, f.signatures


def test_sort_descending_along_a_dynamic_first_dim():
    rng = np.random.default_rng(0)
    f = tc.trace(lambda a: tc.sort(a, 0, descending=True), dynamic=True)
    for n in [6, 7, 100, 301]:
        x = rng.integers(0, 9, (n, 5)).astype(np.int64)
        values, order = f(x)
        want = np.argsort(-x, 0, kind="stable")
        np.testing.assert_array_equal(np.asarray(order), want)
        np.testing.assert_array_equal(np.asarray(values), np.take_along_axis(x, want, 0))
    assert len(f.signatures) == 1


def test_searchsorted_in_a_sequence_of_dynamic_length():
    rng = np.random.default_rng(1)
    f = tc.trace(lambda s, v, u, o: (tc.searchsorted(s, v), tc.searchsorted(u, v, right=True, sorter=o)),
                 dynamic=True)
    for n in [5, 6, 9, 1000, 70000]:
        seq = rng.integers(0, 50, n).astype(np.float32)
        order = np.argsort(seq, kind="stable")
        values = rng.integers(-2, 53, (4, 7)).astype(np.float32)
        left, right = f(np.sort(seq), values, seq, order)
        np.testing.assert_array_equal(np.asarray(left), np.searchsorted(np.sort(seq), values))
        np.testing.assert_array_equal(np.asarray(right), np.searchsorted(seq, values, "right", sorter=order))
    assert len(f.signatures) == 1


@pytest.mark.parametrize("loss", [
    lambda x: (tc.sort(x, -1)[0] * tc.arange(x.shape[-1]).float()).sum(),
    lambda x: (tc.topk(x, 2)[0] ** 2).sum(),
    lambda x: tc.kthvalue(x, 2, 1)[0].sum(),
    lambda x: (tc.median(x, 1)[0] * 3).sum() + tc.median(x),
], ids=["sort", "topk", "kthvalue", "median"])
def test_gradients_of_the_sort_family_with_dynamic_sizes(loss):
    rng = np.random.default_rng(2)
    g = tc.trace(tc.grad(loss), dynamic=True)
    for rows, n in [(3, 5), (4, 6), (6, 9), (5, 40)]:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        want = np.asarray(tc.grad(loss)(tc.tensor(x)))
        np.testing.assert_allclose(np.asarray(g(x)), want, rtol=1e-6, err_msg=f"{rows}x{n}")
    assert len(g.signatures) == 1, g.signatures


I64 = DType.int64


def _steps_kernel(extent) -> Kernel:
    """y[0] = 2 ** steps, `steps` a Let from a size: a Reduce whose trip count is run-time."""
    update = Binary("mul", Var("p", INDEX), Const(2, INDEX), INDEX)
    return Kernel("steps", [Buffer("y", I64, (1,), "output")], [
        Let("steps", Binary("sub", Var("size_n", INDEX), Const(1, INDEX), INDEX)),
        Reduce("k", extent, [Accumulator("p", INDEX, Const(1, INDEX))], [], [update]),
        Store("y", (Const(0, INDEX),), Cast(Var("p", INDEX), I64))], ["size_n"])


def test_a_reduce_may_count_a_let_of_sizes():
    kernel = _steps_kernel(Var("steps", INDEX))
    check_kernel(kernel)
    out = {"y": np.zeros(1, np.int64)}
    LoopInterpreter(kernel, out).block(kernel.body, {"size_n": 6})
    assert out["y"][0] == 32


def test_a_reduce_may_not_count_an_unknown_name():
    with pytest.raises(IRError, match="extent steps2 is neither"):
        check_kernel(_steps_kernel(Var("steps2", INDEX)))
