"""NaN, infinities and signed zeros through every elementwise op and reduction of ops.yaml,
eagerly and compiled, against PyTorch (the oracle for NaN rules: NaN propagates through
max/min/clamp/relu and their reductions; sign(NaN) is 0; a float -> int cast of NaN gives
INT_MIN).  Without PyTorch, the same values are checked against the written rules by the
edge-value samples of tests/tables/op_samples.py.  The ops are taken from the table, so a new
elementwise op or reduction is checked here without an edit."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ops.table import default_table

torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle)")

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5, 0.25, 3.0, -7.0]
TABLE = default_table()


def _tensor_args(name):
    return [a for a in TABLE[name].schema.arguments if a.type.is_tensor]


def _floats_ok(name):
    """Takes floats, and no argument but its tensors is required (not polygamma's n)."""
    args = TABLE[name].schema.arguments
    return TABLE[name].accepts != "integral" and all(a.type.is_tensor or a.has_default for a in args)


UNARY = [n for n, op in TABLE.items() if op.kind == "elementwise" and len(_tensor_args(n)) == 1
         and _floats_ok(n)]
BINARY = [n for n, op in TABLE.items() if op.kind == "elementwise" and len(_tensor_args(n)) == 2
          and n != "clamp" and _floats_ok(n)]


def torch_fn(name: str):
    """PyTorch's function for an op: ops.yaml's `torch:` key (nn.functional.gelu), else torch.<name>."""
    obj = torch
    for part in (TABLE[name].torch or name).split("."):
        obj = getattr(obj, part)
    return obj


def _check(fn_tc, fn_torch, arrays, what):
    want = fn_torch(*[torch.from_numpy(a) for a in arrays])
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    for mode, fn in (("eager", lambda *a: fn_tc(*[tc.tensor(x) for x in a])), ("compiled", tc.trace(fn_tc))):
        got = fn(*arrays)
        got = [g.numpy() for g in (got if isinstance(got, tuple) else (got,))]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype, f"{what} {mode}: dtype {g.dtype}, torch {w.dtype}"
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=ATOL.get(what, 0), equal_nan=True,
                                       err_msg=f"{what} {mode} on {arrays}")


# x - tanh(x) cancels near 0: an ulp of tanh(0.25) in float32 (1.5e-8) is 3e-6 of the result,
# and tracecomp's tanh and PyTorch's may differ by one
ATOL = {"tanhshrink": 3e-8}

# Where PyTorch's answer is not the limit: (op, input) -> tracecomp's answer, and why.
DIFFERENT = {
    ("gelu", np.inf): (np.inf, "x * Phi(x) -> inf; PyTorch's CPU kernel gives NaN"),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", UNARY)
def test_unary(name, dtype):
    special = [v for v in SPECIAL if (name, v) not in DIFFERENT]
    _check(getattr(tc, name), torch_fn(name), [np.array(special, dtype)], name)
    for (op, v), (want, _why) in DIFFERENT.items():
        if op == name:
            x = np.array([v], dtype)
            assert getattr(tc, name)(tc.tensor(x)).numpy()[0] == want
            assert tc.trace(getattr(tc, name))(x).numpy()[0] == want


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", BINARY)
def test_binary(name, dtype):
    x, y = (a.ravel() for a in np.meshgrid(np.array(SPECIAL, dtype), np.array(SPECIAL, dtype)))
    _check(getattr(tc, name), torch_fn(name), [x, y], name)


def test_clamp():
    x = np.array(SPECIAL, np.float32)
    _check(lambda x: tc.clamp(x, -1.0, 1.0), lambda x: torch.clamp(x, -1.0, 1.0), [x], "clamp")
    lo, hi = np.array([np.nan, 0.0] * 5, np.float32), np.array([2.0, np.nan] * 5, np.float32)
    _check(tc.clamp, torch.clamp, [x, lo, hi], "clamp with NaN bounds")


ROWS = np.array([[np.nan, 1.0, 2.0], [np.inf, -np.inf, 0.0], [1.0, 2.0, 3.0], [-np.inf, -np.inf, 1.0],
                 [np.inf, np.inf, 5.0], [2.0, np.nan, -np.inf]])
REDUCTIONS = {
    "sum": {}, "mean": {}, "prod": {}, "amax": {}, "amin": {}, "all": {}, "any": {},
    "max": {}, "min": {}, "argmax": {}, "argmin": {}, "var": {}, "std": {},
    "max.dim": {"dim": 1}, "min.dim": {"dim": 1},
}


def test_every_reduction_is_listed():
    kinds = ("reduction", "arg_reduction", "variance")
    assert sorted(n for n, op in TABLE.items() if op.kind in kinds) == sorted(REDUCTIONS)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("over", ["all", "rows"])
def test_reduction(name, over, dtype):
    base, kwargs = name.split(".")[0], dict(REDUCTIONS[name])
    if over == "rows":
        kwargs.setdefault("dim", 1)
    elif "dim" in kwargs:
        pytest.skip(f"{name} always takes a dim")
    x = ROWS.astype(dtype)
    _check(lambda x: getattr(tc, base)(x, **kwargs), lambda x: getattr(torch, base)(x, **kwargs), [x],
           f"{name}({kwargs})")


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_row_functions(name):
    x = ROWS.astype(np.float32)
    _check(lambda x: getattr(tc, name)(x, 1), lambda x: getattr(torch, name)(x, 1), [x], name)


@pytest.mark.parametrize("to", ["int32", "int64", "bool"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_casts(to, dtype):
    x = np.array(SPECIAL + [1e10, -1e10, 2.0 ** 31, -2.0 ** 31, 2.0 ** 63, 3.7, -3.7], dtype)
    _check(lambda x: x.to(getattr(tc, to)), lambda x: x.to(getattr(torch, to)), [x], f"cast to {to}")


@pytest.mark.parametrize("other", [0, 0.0, -0.0, 2, -1.5])
def test_a_python_number_that_a_formula_divides_by_gives_ieee_results(other):
    """copysign's formula reads the sign of a zero as 1 / other: a Python 0 or -0.0 used to
    raise ZeroDivisionError (eagerly and while scheduling) instead of giving inf / -inf."""
    x = np.array([1.0, -2.0, 0.0], np.float32)
    expected = np.copysign(x, np.float32(other))
    eager = tc.copysign(tc.tensor(x), other).numpy()
    traced = tc.trace(lambda t: tc.copysign(t, other))(tc.tensor(x)).numpy()
    for got in (eager, traced):
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
