"""Randomized op checks with hypothesis: every unary elementwise op on random shapes and
dtypes; every binary elementwise op (and where, clamp) on random broadcastable shapes,
dtypes and Python-scalar operands; every reduction over random dims (int, tuple,
negative) with and without keepdim. Eager against NumPy float64, traced against eager."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import tracecomp as tc
from tracecomp.ops.table import default_table

from tables.op_samples import (ALL, B, BINARY, FLOATS, I64, INTS, NUMERIC, UNARY, Sample, assert_close,
                        binary_result, floating, leaves, reference_inputs, torch_result_type)

TABLE = default_table()
PROFILE = settings(max_examples=25, deadline=None, derandomize=True)


def _tensor_args(op) -> list[str]:
    return [a.name for a in op.schema.arguments if a.type.is_tensor and not a.type.is_list]


BINARY_OPS = [n for n, op in TABLE.items() if op.kind == "elementwise" and len(_tensor_args(op)) == 2]


def values(rng: np.random.Generator, shape, dtype: str, lo: float, hi: float) -> np.ndarray:
    if dtype == B:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in INTS:
        return np.asarray(rng.integers(int(lo), int(hi), size=shape), dtype=dtype)
    return np.asarray(rng.uniform(lo, hi, size=shape), dtype=dtype)


def scalar_of(rng: np.random.Generator, dtype: str, lo: float, hi: float):
    """A Python scalar of the dtype's kind (bool, int or float)."""
    if dtype == B:
        return bool(rng.random() < 0.5)
    if dtype in INTS:
        return int(rng.integers(int(lo), int(hi)))
    return float(np.round(rng.uniform(lo, hi), 3))


def compare(case: Sample, got: list, want) -> None:
    want = list(want) if isinstance(want, tuple) else [want]
    expected = list(case.dtype) if isinstance(case.dtype, tuple) else [case.dtype]
    assert len(got) == len(want) == len(expected)
    for i, (g, w, d) in enumerate(zip(got, want, expected)):
        assert str(g.dtype) == d, f"{case.id}: result {i} has dtype {g.dtype}, PyTorch's rules give {d}"
        assert_close(case, g, w, i)


def check(case: Sample) -> None:
    """Eager against the float64 reference, then traced against eager, bit for bit."""
    eager = [np.asarray(t) for t in leaves(case.call(*[tc.tensor(a) for a in case.inputs]))]
    with np.errstate(all="ignore"):
        want = case.ref(*reference_inputs(case.inputs))
    compare(case, eager, want)
    traced = [np.asarray(t) for t in leaves(tc.trace(case.call, backend="interp")(*case.inputs))]
    for i, (e, t) in enumerate(zip(eager, traced)):
        assert (t.dtype, t.shape) == (e.dtype, e.shape), f"{case.id}: traced result {i} differs in type"
        np.testing.assert_array_equal(t, e, err_msg=f"{case.id}: traced result {i}", strict=True)


# ---------------------------------------------------------------- unary elementwise

UNARY_OPS = [n for n, op in TABLE.items() if op.kind == "elementwise" and len(_tensor_args(op)) == 1
             and all(a.type.is_tensor or a.has_default for a in op.schema.arguments)]   # not polygamma(n, x)


def test_unary_ops_have_references():
    assert sorted(UNARY_OPS) == sorted(UNARY), "a unary elementwise op needs an entry in op_samples.UNARY"


@pytest.mark.parametrize("name", UNARY_OPS)
@PROFILE
@given(data=st.data())
def test_unary_shapes_and_dtypes(name, data):
    ref, domain, rule, dtypes, method = UNARY[name]
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    dtype = data.draw(st.sampled_from(dtypes))
    lo, hi = {"sqrt": (0, 4), "rsqrt": (0.1, 4), "log": (0.1, 4), "log2": (0.1, 4), "log1p": (-0.9, 4),
              "reciprocal": (0.1, 4), "tan": (-1.2, 1.2)}.get(name, (-4, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = values(rng, shape, dtype, lo, hi if dtype not in INTS else hi + 1)
    if dtype in INTS and lo > 0:
        x = np.asarray(np.maximum(x, 1), dtype=dtype)
    out = dtype if rule == "same" else B if rule == "bool" else floating(dtype)
    use_method = method and data.draw(st.booleans())
    call = (lambda t: getattr(t, name)()) if use_method else getattr(tc, name)
    reference = (lambda v: ref(np.asarray(v, np.float64))) if rule == "float" else ref
    check(Sample(name, call, (x,), reference, out, f"{name}({dtype}{shape})"))


# ---------------------------------------------------------------- binary elementwise

def test_binary_ops_have_references():
    assert sorted(BINARY_OPS) == sorted(BINARY), "a binary elementwise op needs an entry in op_samples.BINARY"


def _domains(name: str):
    """(lo, hi) for the first and second operand, keeping each op's domain valid."""
    if name == "pow":
        return (0.5, 3.0), (0, 3)
    if name == "div":
        return (-3.0, 3.0), (1, 4)
    return (-3.0, 3.0), (-3, 3)


@pytest.mark.parametrize("name", BINARY_OPS)
@PROFILE
@given(data=st.data())
def test_binary_broadcasting(name, data):
    ref, _, dtypes, _ = BINARY[name]
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=0,
                                                         max_side=4)).input_shapes
    da, db = data.draw(st.sampled_from(dtypes)), data.draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    (alo, ahi), (blo, bhi) = _domains(name)
    a = values(rng, shapes[0], da, alo, ahi)
    if data.draw(st.booleans()) and not (name == "div" and db == B):
        b = scalar_of(rng, db, blo, bhi)                      # a weak Python scalar operand
        call = (lambda x, s=b: getattr(tc, name)(x, s))
        reference, inputs = (lambda x, s=b: ref(x, s)), [a]
    else:
        b = values(rng, shapes[1], db, blo, bhi)
        if name == "div":
            b = np.where(b == 0, np.ones_like(b), b)
        call, reference, inputs = getattr(tc, name), ref, [a, b]
    check(Sample(name, call, tuple(inputs), reference, binary_result(name, a, b),
                 f"{name}({da}{shapes[0]}, {b if np.isscalar(b) else f'{db}{shapes[1]}'})"))


@PROFILE
@given(data=st.data())
def test_where_broadcasting(data):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4)).input_shapes
    dx, dy = data.draw(st.sampled_from(ALL)), data.draw(st.sampled_from(ALL))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    c, x, y = values(rng, shapes[0], B, 0, 1), values(rng, shapes[1], dx, -3, 3), values(rng, shapes[2], dy, -3, 3)
    check(Sample("where.self", tc.where, (c, x, y), np.where, torch_result_type(x, y),
                 f"where({shapes[0]}, {dx}{shapes[1]}, {dy}{shapes[2]})"))


@PROFILE
@given(data=st.data())
def test_clamp_broadcasting(data):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4)).input_shapes
    dx = data.draw(st.sampled_from(NUMERIC))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = values(rng, shapes[0], dx, -3, 3)
    lo, hi = values(rng, shapes[1], dx, -3, 0), values(rng, shapes[2], dx, 0, 3)
    check(Sample("clamp", tc.clamp, (x, lo, hi), lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
                 dx, f"clamp({dx}{shapes[0]}, {shapes[1]}, {shapes[2]})"))


# ---------------------------------------------------------------- reductions

def _axes(ndim: int, dim):
    if ndim == 0:
        return None
    if dim is None or dim == ():
        return tuple(range(ndim))
    return tuple(d % ndim for d in ((dim,) if isinstance(dim, int) else dim))


def _np(fn, **kw):
    def ref(x, dim, keepdim):
        return fn(x, axis=_axes(x.ndim, dim), keepdims=keepdim, **kw)
    return ref


def _logsumexp(x, dim, keepdim):
    return np.log(np.sum(np.exp(x), axis=_axes(x.ndim, dim), keepdims=keepdim))


def _argref(fn):
    def ref(x, dim, keepdim):
        if dim is None or x.ndim == 0:
            out = np.int64(fn(x))
            return out.reshape((1,) * x.ndim) if keepdim else out
        return fn(x, axis=dim % x.ndim, keepdims=keepdim)
    return ref


def _dimref(fn, argfn):
    def ref(x, dim, keepdim):
        return _np(fn)(x, dim, keepdim), _argref(argfn)(x, dim, keepdim)
    return ref


# name: (reference, dtypes, dim form, result dtype from the input dtype)
#   dim forms: "dims" (None, int or tuple), "dims!" (int or tuple, no None),
#   "int" (an int), "int?" (an int or None), "none" (the op takes no dim)
REDUCTIONS = {
    "sum": (_np(np.sum), ALL, "dims", lambda d: d if d in FLOATS else I64),
    "prod": (_np(np.prod), ALL, "dims", lambda d: d if d in FLOATS else I64),
    "mean": (_np(np.mean), FLOATS, "dims", lambda d: d),
    "amax": (_np(np.max), ALL, "dims", lambda d: d),
    "amin": (_np(np.min), ALL, "dims", lambda d: d),
    "all": (_np(np.all), ALL, "dims", lambda d: B),
    "any": (_np(np.any), ALL, "dims", lambda d: B),
    "var": (_np(np.var, ddof=1), FLOATS, "dims", lambda d: d),
    "std": (_np(np.std, ddof=1), FLOATS, "dims", lambda d: d),
    "logsumexp": (_logsumexp, NUMERIC, "dims!", floating),
    "max": (_np(np.max), ALL, "none", lambda d: d),
    "min": (_np(np.min), ALL, "none", lambda d: d),
    "max.dim": (_dimref(np.max, np.argmax), NUMERIC, "int", lambda d: (d, I64)),
    "min.dim": (_dimref(np.min, np.argmin), NUMERIC, "int", lambda d: (d, I64)),
    "argmax": (_argref(np.argmax), NUMERIC, "int?", lambda d: I64),
    "argmin": (_argref(np.argmin), NUMERIC, "int?", lambda d: I64),
}


def test_every_reduction_is_covered():
    kinds = {"reduction", "arg_reduction", "variance"}
    table = {n for n, op in TABLE.items() if op.kind in kinds} | {"logsumexp"}
    assert sorted(table) == sorted(REDUCTIONS)


@st.composite
def dims(draw, ndim: int, form: str):
    n = max(ndim, 1)
    one = st.integers(-n, n - 1)
    many = st.lists(st.integers(0, n - 1), unique=True, min_size=1, max_size=n).flatmap(
        lambda ds: st.tuples(*[st.sampled_from([d, d - n]) for d in ds]))
    options = {"dims": st.none() | one | many, "dims!": one | many, "int": one, "int?": st.none() | one,
               "none": st.none()}[form]
    return draw(options)


@pytest.mark.filterwarnings("ignore:Degrees of freedom <= 0:RuntimeWarning")   # var/std, correction >= n
@pytest.mark.parametrize("name", list(REDUCTIONS))
@PROFILE
@given(data=st.data())
def test_reduction_dims(name, data):
    ref, dtypes, form, result = REDUCTIONS[name]
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
    dtype = data.draw(st.sampled_from(dtypes))
    dim = data.draw(dims(len(shape), form))
    keepdim = data.draw(st.booleans()) if form != "none" else False
    correction = data.draw(st.sampled_from([None, 0, 1, 2])) if name in ("var", "std") else None
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = values(rng, shape, dtype, -3, 3)
    fn = getattr(tc, name.split(".")[0])
    kwargs = {} if form == "none" else {"keepdim": keepdim}
    if dim is not None:
        kwargs["dim"] = dim
    if correction is not None:
        kwargs["correction"] = correction

    def reference(x):
        if correction is not None:
            method = np.var if name == "var" else np.std
            return method(x, axis=_axes(x.ndim, dim), keepdims=keepdim, ddof=correction)
        return ref(x, dim, keepdim)
    use_method = data.draw(st.booleans())
    call = (lambda t: getattr(t, name.split(".")[0])(**kwargs)) if use_method else (lambda t: fn(t, **kwargs))
    check(Sample(name, call, (x,), reference, result(dtype),
                 f"{'x.' if use_method else 'tc.'}{name}({dtype}{shape}, {kwargs})", rtol=1e-4, atol=1e-5))
