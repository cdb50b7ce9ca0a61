"""Sample inputs for every operator in ops.yaml: how to call it, on what, and the answer.

`SAMPLES[full_name]` is a list of Sample: a call through the public API (function,
method, operator or property, covering the op's variants), its tensor inputs (small
NumPy arrays from a seeded generator, in every dtype the op allows, plus a few edge
values), a NumPy float64 reference, and the result dtype PyTorch's promotion rules
give (`torch_result_type` below restates those rules independently of tracecomp).
Samples of `tensor[index]` are filed under the ops the index becomes (select, slice,
unsqueeze).  Tests in test_ops.py and test_op_properties.py are driven by this table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import tracecomp as tc

F32, F64, I32, I64, B = "float32", "float64", "int32", "int64", "bool"
FLOATS, INTS, NUMERIC, ALL = (F32, F64), (I32, I64), (F32, F64, I32, I64), (F32, F64, I32, I64, B)


@dataclass
class Sample:
    op: str                         # full name in ops.yaml
    call: Callable[..., Any]        # call(*tensors) through the public API
    inputs: tuple[np.ndarray, ...]  # the tensor arguments (other arguments live in `call`)
    ref: Callable[..., Any] | None  # NumPy reference on the inputs in float64/int64/bool
    dtype: str | tuple[str, ...]    # expected result dtype(s) by PyTorch's rules
    desc: str
    rtol: float | None = None       # None: by result dtype (see tolerance())
    atol: float | None = None
    nondeterministic: bool = False
    shape: tuple | None = None      # expected shape(s) where there is no reference

    @property
    def id(self) -> str:
        return f"{self.op}:{self.desc}"


_rng = np.random.default_rng(20240611)


def assert_outputs_match(got, want) -> None:
    """Two backends' outputs agree: same dtypes and shapes; floats within a few ulp-scaled
    tolerances (NaN where NaN), everything else exactly."""
    assert len(got) == len(want)
    for o, e in zip(got, want):
        assert (o.dtype, o.shape) == (e.dtype, e.shape)
        if e.dtype.kind == "f":
            tol = 1e-5 if e.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(o, e, rtol=tol * 20, atol=tol, equal_nan=True)
        else:
            np.testing.assert_array_equal(o, e)


def arr(shape, dtype=F32, lo=-3.0, hi=3.0) -> np.ndarray:
    """Random values in [lo, hi) (ints: integers in that range; bools: coin flips)."""
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    if dtype == B:
        return np.asarray(_rng.random(shape) < 0.5)
    if dtype in INTS:
        return np.asarray(_rng.integers(int(lo), int(hi), size=shape), dtype=dtype)
    return np.asarray(_rng.uniform(lo, hi, size=shape), dtype=dtype)


def pos(shape, dtype=F32, lo=0.25, hi=4.0) -> np.ndarray:
    return arr(shape, dtype, lo, hi) if dtype not in INTS else arr(shape, dtype, 1, 6)


def distinct(shape, dtype=F32) -> np.ndarray:
    """Values without ties (for argmax/argmin/max.dim, whose index is ambiguous on ties)."""
    n = math.prod(shape)
    return (_rng.permutation(n) - n // 2).reshape(shape).astype(dtype) * (0.5 if dtype in FLOATS else 1)


def int_cast(to):
    """The written rule for float -> int casts (README, "Semantics worth knowing"): truncate;
    NaN, infinities and values outside the integer's range give its minimum, as on x86."""
    def ref(x):
        info = np.iinfo(to)
        x = np.asarray(x, np.float64)
        ok = np.isfinite(x) & (x >= info.min) & (x < -float(info.min))
        return np.where(ok, np.trunc(np.where(ok, x, 0)), info.min).astype(to)
    return ref


def edge(dtype=F32) -> np.ndarray:
    """Edge values: zeros of both signs, negatives, large, tiny and non-finite."""
    return np.array([0.0, -0.0, -1.0, 1.0, -2.5, 3.5, 1e-30, 1e20, -1e20, np.inf, -np.inf, np.nan],
                    dtype=dtype)


# ---------------------------------------------------------------- PyTorch's dtype rules

_ORDER = [B, I32, I64, F32, F64]
_CATEGORY = {B: 0, I32: 1, I64: 1, F32: 2, F64: 2}


def _scalar_dtype(v) -> str:
    return B if isinstance(v, bool) else I64 if isinstance(v, int) else F32


def _fold(ds):
    return max(ds, key=_ORDER.index) if ds else None


def _combine(higher, lower):
    """c10's combine_categories: a lower tier only matters if its category is higher."""
    if higher is None:
        return lower
    if lower is None or _CATEGORY[higher] == 2:
        return higher
    if higher == B or _CATEGORY[lower] == 2:
        return _fold([higher, lower])
    return higher


def torch_result_type(*operands) -> str:
    """torch.result_type: tensors with dims, then 0-d tensors, then Python scalars."""
    dims = [str(a.dtype) for a in operands if isinstance(a, np.ndarray) and a.ndim]
    zero = [str(a.dtype) for a in operands if isinstance(a, np.ndarray) and not a.ndim]
    scalars = [_scalar_dtype(a) for a in operands if not isinstance(a, np.ndarray) and a is not None]
    return _combine(_fold(dims), _combine(_fold(zero), _fold(scalars)))


def floating(dtype: str) -> str:
    """Integral and bool inputs of a floating op compute in the default dtype (float32)."""
    return dtype if dtype in FLOATS else F32


def reference_inputs(inputs) -> list:
    """What references get: floats widened to float64, ints to int64."""
    out = []
    for a in inputs:
        a = np.asarray(a)
        out.append(a.astype(np.float64) if a.dtype.kind == "f" else
                   a.astype(np.int64) if a.dtype.kind in "iu" else a)
    return out


# ---------------------------------------------------------------- comparing results

def leaves(result) -> list:
    """The result tensors of a call, in order (ops return one tensor, tuples or named tuples)."""
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in leaves(r)]
    return [result]


def expected_dtypes(s: Sample) -> list[str]:
    return list(s.dtype) if isinstance(s.dtype, tuple) else [s.dtype]


def tolerance(s: Sample, dtype: np.dtype) -> tuple[float, float]:
    if dtype.kind != "f":
        return 0.0, 0.0
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-10, 1e-12)
    return (s.rtol if s.rtol is not None else rtol), (s.atol if s.atol is not None else atol)


def assert_close(s: Sample, got: np.ndarray, want: np.ndarray, i: int) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, f"{s.id}: result {i} has shape {got.shape}, reference {want.shape}"
    if got.dtype.kind != "f":
        # exact: the reference is computed in int64/bool/float64 and must be representable
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=s.id)
        return
    rtol, atol = tolerance(s, got.dtype)
    with np.errstate(all="ignore"):
        want = want.astype(got.dtype).astype(np.float64)   # values outside float32's range become inf
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=s.id)


SAMPLES: dict[str, list[Sample]] = {}
# Ops whose result shapes depend on input values: tc.trace compiles them with value-dependent
# sizes or raises a TraceError (tests/ops/test_ops.py checks which); kept apart so the traced
# and compiled tests of static shapes do not pick them up.
EAGER_ONLY: dict[str, list[Sample]] = {}


def eager_only(op, call, inputs, ref, dtype, desc, **kw) -> None:
    EAGER_ONLY.setdefault(op, []).append(Sample(op, call, tuple(inputs), ref, dtype, desc, **kw))


def sample(op, call, inputs, ref, dtype, desc, **kw) -> None:
    if dtype is None:               # an operand combination the op refuses (binary_result)
        return
    SAMPLES.setdefault(op, []).append(Sample(op, call, tuple(inputs), ref, dtype, desc, **kw))


def _vec(fn):
    """A float64 ufunc from a scalar math function (math.erf etc.)."""
    f = np.vectorize(fn, otypes=[np.float64])
    return lambda x: f(np.asarray(x, np.float64))


# ---------------------------------------------------------------- unary elementwise

def _erf(x):
    return _vec(math.erf)(x)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _lgamma1(v: float) -> float:
    try:
        return math.lgamma(v)
    except ValueError:          # a pole: 0 or a negative integer
        return math.inf


def _erfinv1(v: float) -> float:
    """erf's inverse by bisection (an independent reference)."""
    if math.isnan(v) or abs(v) > 1:
        return math.nan
    if abs(v) == 1:
        return math.copysign(math.inf, v)
    lo, hi = 0.0, 7.0                    # on |v|; near 1 through erfc, which keeps its digits
    for _ in range(200):
        mid = (lo + hi) / 2
        below = math.erfc(mid) > 1 - abs(v) if abs(v) > 0.5 else math.erf(mid) < abs(v)
        lo, hi = (mid, hi) if below else (lo, mid)
    return math.copysign((lo + hi) / 2, v)


def _polygamma1(n: int, v: float) -> float:
    """psi^(n)(v) from its defining series: (-1)^(n+1) n! sum 1/(v+k)^(n+1), n >= 1, summed
    to 4000 terms plus the Euler-Maclaurin tail (an independent reference); n = 0 by
    psi(v) = psi(v + 4000) - sum 1/(v+k), psi(w) ~ log w - 1/2w - 1/12w^2 + 1/120w^4."""
    if math.isnan(v) or v == -math.inf or (v <= 0 and v == math.floor(v) and n == 0 and v != 0):
        return math.nan
    if v == 0:
        return -math.copysign(math.inf, v) if n == 0 else math.inf * (-1) ** (n + 1)
    if v == math.inf:
        return math.inf if n == 0 else 0.0
    k = 4000
    w = v + k
    total = math.fsum(1 / (v + j) ** (n + 1) for j in range(k))
    if n == 0:
        return math.log(w) - 1 / (2 * w) - 1 / (12 * w * w) + 1 / (120 * w ** 4) - total
    tail = 1 / (n * w ** n) + 1 / (2 * w ** (n + 1)) + (n + 1) / (12 * w ** (n + 2))
    return (-1) ** (n + 1) * math.factorial(n) * (total + tail)


def _sigmoid(x):
    return _vec(lambda v: v if math.isnan(v) else 1 / (1 + math.exp(-v)) if v >= -700 else 0.0)(x)


# op: (reference, domain of the random inputs, result rule, dtypes, has method)
UNARY = {
    "neg": (np.negative, arr, "same", NUMERIC, True),
    "abs": (np.abs, arr, "same", NUMERIC, True),
    "sign": (lambda x: x if x.dtype == bool else np.nan_to_num(np.sign(x), nan=0.0), arr, "same", ALL, True),
    "reciprocal": (lambda x: 1 / np.asarray(x, np.float64), pos, "float", ALL, True),
    "square": (np.square, arr, "same", NUMERIC, True),
    "sqrt": (np.sqrt, pos, "float", ALL, True),
    "rsqrt": (lambda x: 1 / np.sqrt(np.asarray(x, np.float64)), pos, "float", ALL, True),
    "exp": (np.exp, arr, "float", ALL, True),
    "exp2": (np.exp2, arr, "float", ALL, True),
    "expm1": (np.expm1, arr, "float", ALL, True),
    "log": (np.log, pos, "float", ALL, True),
    "log2": (np.log2, pos, "float", ALL, True),
    "log1p": (np.log1p, pos, "float", ALL, True),
    "sin": (np.sin, arr, "float", ALL, True),
    "cos": (np.cos, arr, "float", ALL, True),
    "tan": (np.tan, lambda s, d: arr(s, d, -1.2, 1.2), "float", ALL, True),
    "tanh": (np.tanh, arr, "float", ALL, True),
    "sigmoid": (_sigmoid, arr, "float", ALL, True),
    "relu": (lambda x: np.maximum(x, 0), arr, "same", NUMERIC, True),
    "silu": (lambda x: x * _sigmoid(x), arr, "float", ALL, False),
    "gelu": (_gelu, arr, "float", ALL, False),
    "erf": (_erf, arr, "float", ALL, True),
    "floor": (np.floor, arr, "same", NUMERIC, True),
    "ceil": (np.ceil, arr, "same", NUMERIC, True),
    "round": (np.round, lambda s, d: arr(s, d, -4, 4) if d in INTS else
              np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51, 3.7], d), "same", NUMERIC, True),
    "logical_not": (np.logical_not, arr, "bool", ALL, True),
    "sinh": (np.sinh, arr, "float", ALL, True),
    "cosh": (np.cosh, arr, "float", ALL, True),
    "asin": (np.arcsin, lambda s, d: arr(s, d, -1, 1) if d in FLOATS else arr(s, d, -1, 2), "float", ALL, True),
    "acos": (np.arccos, lambda s, d: arr(s, d, -1, 1) if d in FLOATS else arr(s, d, -1, 2), "float", ALL, True),
    "atan": (np.arctan, arr, "float", ALL, True),
    "asinh": (np.arcsinh, arr, "float", ALL, True),
    "acosh": (np.arccosh, lambda s, d: pos(s, d, 1.0, 6.0), "float", ALL, True),
    "atanh": (np.arctanh, lambda s, d: arr(s, d, -0.95, 0.95) if d in FLOATS else arr(s, d, 0, 1), "float", ALL, True),
    "trunc": (np.trunc, arr, "same", NUMERIC, True),
    "frac": (lambda x: x - np.trunc(x), arr, "same", FLOATS, True),
    "isnan": (np.isnan, arr, "bool", ALL, True),
    "isinf": (np.isinf, arr, "bool", ALL, True),
    "isposinf": (np.isposinf, arr, "bool", NUMERIC, True),
    "isneginf": (np.isneginf, arr, "bool", NUMERIC, True),
    "isfinite": (np.isfinite, arr, "bool", ALL, True),
    "nan_to_num": (np.nan_to_num, arr, "same", ALL, True),
    "deg2rad": (np.deg2rad, arr, "float", ALL, True),
    "rad2deg": (np.rad2deg, arr, "float", ALL, True),
    "sinc": (np.sinc, arr, "float", ALL, True),
    "bitwise_not": (np.invert, arr, "same", (I32, I64, B), True),
    "softplus": (lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))), arr, "float", ALL, False),
    "leaky_relu": (lambda x: np.where(x > 0, x, 0.01 * x), arr, "same", FLOATS, False),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), arr, "same", FLOATS, False),
    "selu": (lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0))),
             arr, "same", FLOATS, False),
    "celu": (lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), arr, "same", FLOATS, False),
    "hardtanh": (lambda x: np.clip(x, -1, 1), arr, "same", NUMERIC, False),
    "relu6": (lambda x: np.clip(x, 0, 6), lambda s, d: arr(s, d, -8, 8), "same", NUMERIC, False),
    "hardsigmoid": (lambda x: np.clip(x + 3, 0, 6) / 6, lambda s, d: arr(s, d, -5, 5), "same", FLOATS, False),
    "hardswish": (lambda x: x * np.clip(x + 3, 0, 6) / 6, lambda s, d: arr(s, d, -5, 5), "same", FLOATS, False),
    "mish": (lambda x: x * np.tanh(np.logaddexp(0, x)), arr, "same", FLOATS, False),
    "logsigmoid": (lambda x: -np.logaddexp(0, -x), arr, "same", FLOATS, False),
    "softsign": (lambda x: x / (1 + np.abs(x)), arr, "float", ALL, False),
    "tanhshrink": (lambda x: x - np.tanh(x), arr, "float", ALL, False),
    "clone": (lambda x: np.array(x, copy=True), arr, "same", ALL, True),
    "erfc": (_vec(math.erfc), lambda s, d: arr(s, d, -3, 9), "float", ALL, True),
    "erfinv": (_vec(_erfinv1), lambda s, d: arr(s, d, -1, 1) if d in FLOATS else arr(s, d, -1, 2), "float", ALL, True),
    "lgamma": (_vec(_lgamma1), arr, "float", ALL, True),
    "digamma": (_vec(lambda v: _polygamma1(0, v)), arr, "float", ALL, True),
}
# Ops whose NaN/inf edge values are meaningful (reciprocal/rsqrt/log of 0, etc.); not the
# integer-only ones, nor nan_to_num, whose reference in float64 knows no float32 maximum
EDGE_OK = set(UNARY) - {"bitwise_not", "nan_to_num"}


def _unary_samples():
    for name, (ref, domain, rule, dtypes, method) in UNARY.items():
        fn = getattr(tc, name)
        if rule == "float":     # bool inputs compute in float64 too (NumPy would pick float16)
            ref = (lambda r: lambda x: r(np.asarray(x, np.float64)))(ref)
        for i, d in enumerate(dtypes):
            x = domain((2, 3) if i % 2 else (5,), d)
            out = d if rule == "same" else B if rule == "bool" else floating(d)
            sample(name, fn, [x], ref, out, f"tc.{name}({d})")
            if method and i == 0:
                sample(name, lambda t, n=name: getattr(t, n)(), [x], ref, out, f"x.{name}() {d}")
        if F64 in dtypes:
            sample(name, fn, [np.array(0.75 if name != "round" else 2.5, np.float64)], ref,
                   F64 if rule != "bool" else B, "0-d float64")
        if name in EDGE_OK:
            sample(name, fn, [edge(F32)], ref, F32 if rule != "bool" else B, "edge values f32")
    sample("neg", lambda x: -x, [arr((3, 2), I32)], np.negative, I32, "-x int32")
    sample("abs", abs, [arr((4,), F64)], np.abs, F64, "abs(x) f64")
    sample("gelu", lambda x: tc.gelu(x, approximate="tanh"), [arr((7,), F32)], _gelu_tanh, F32,
           "approximate='tanh'")
    sample("gelu", lambda x: tc.gelu(x, approximate="tanh"), [arr((2, 2), F64)], _gelu_tanh, F64,
           "approximate='tanh' f64")
    sample("logical_not", tc.logical_not, [np.array([0.0, -0.0, np.nan, 2.0], F32)],
           np.logical_not, B, "zeros and nan")
    sample("sigmoid", tc.sigmoid, [np.array([-100.0, -30.0, 0.0, 30.0, 100.0], F32)], _sigmoid, F32,
           "saturation")
    sample("round.decimals", lambda x: tc.round(x, decimals=2), [arr((6,), F32)], lambda x: np.round(x, 2), F32,
           "decimals=2")
    sample("round.decimals", lambda x: x.round(decimals=-2), [arr((2, 3), F64, -900, 900)],
           lambda x: np.round(x, -2), F64, "x.round(decimals=-2) f64")
    sample("nan_to_num", tc.nan_to_num, [edge(F32)], lambda x: np.nan_to_num(x.astype(np.float32)), F32,
           "edge values f32: infinities become float32's extremes")
    sample("nan_to_num", lambda x: x.nan_to_num(nan=1.5, posinf=9.0, neginf=-9.0), [edge(F64)],
           lambda x: np.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0), F64, "nan=, posinf=, neginf=")
    sample("softplus", lambda x: tc.softplus(x, beta=2, threshold=5), [arr((6,), F64, -6, 6)],
           lambda x: np.where(2 * x > 5, x, np.log1p(np.exp(2 * x)) / 2), F64, "beta=2, threshold=5")
    sample("leaky_relu", lambda x: tc.leaky_relu(x, 0.2), [arr((6,), F32)],
           lambda x: np.where(x > 0, x, 0.2 * x), F32, "negative_slope=0.2")
    sample("elu", lambda x: tc.elu(x, alpha=0.5), [arr((6,), F64)],
           lambda x: np.where(x > 0, x, 0.5 * np.expm1(np.minimum(x, 0))), F64, "alpha=0.5")
    sample("celu", lambda x: tc.celu(x, alpha=2.0), [arr((6,), F64)],
           lambda x: np.where(x > 0, x, 2 * np.expm1(np.minimum(x, 0) / 2)), F64, "alpha=2")
    sample("hardtanh", lambda x: tc.hardtanh(x, -2.0, 0.5), [arr((6,), F32)],
           lambda x: np.clip(x, -2, 0.5), F32, "min_val=-2, max_val=0.5")
    sample("bitwise_not", lambda x: ~x, [arr((5,), I64, -9, 9)], np.invert, I64, "~x int64")
    sample("asinh", tc.asinh, [np.array([1e-30, -1e-8, 1e8, -1e19, 1e300], F64)], np.arcsinh, F64,
           "tiny and huge")
    sample("acosh", tc.acosh, [np.array([1.0001, 1.5, 1e7, 1e300], F64)], np.arccosh, F64,
           "near 1 and huge")
    sample("round.decimals", lambda x: tc.round(x, decimals=0), [np.array([0.5, 1.5, -2.5], F32)], np.round, F32,
           "decimals=0 ties to even")


_unary_samples()


# ---------------------------------------------------------------- binary elementwise

def _pow_ref(a, b):
    return np.power(np.asarray(a, np.float64), b)


def _in_float64(fn):
    """A binary reference computed in float64 (NumPy would take bools to float16)."""
    return lambda a, b: fn(np.asarray(a, np.float64), np.asarray(b, np.float64))


BINARY = {
    # op: (reference, dtype rule, dtypes, domain of `other`)
    "add": (np.add, "promote", ALL, arr),
    "sub": (np.subtract, "promote", NUMERIC, arr),
    "mul": (np.multiply, "promote", ALL, arr),
    "div": (lambda a, b: np.divide(np.asarray(a, np.float64), b), "float", ALL, pos),
    "pow": (_pow_ref, "promote", NUMERIC, lambda s, d: arr(s, d, 0, 3)),
    "maximum": (np.maximum, "promote", ALL, arr),
    "minimum": (np.minimum, "promote", ALL, arr),
    "atan2": (lambda a, b: np.arctan2(np.asarray(a, np.float64), b), "float", ALL, arr),
    "eq": (np.equal, "bool", ALL, arr),
    "ne": (np.not_equal, "bool", ALL, arr),
    "lt": (np.less, "bool", ALL, arr),
    "le": (np.less_equal, "bool", ALL, arr),
    "gt": (np.greater, "bool", ALL, arr),
    "ge": (np.greater_equal, "bool", ALL, arr),
    "logical_and": (np.logical_and, "logical", ALL, arr),
    "logical_or": (np.logical_or, "logical", ALL, arr),
    "fmod": (np.fmod, "promote", NUMERIC, pos),
    "remainder": (np.remainder, "promote", NUMERIC, pos),
    "floor_divide": (np.floor_divide, "promote", NUMERIC, pos),
    "bitwise_and": (np.bitwise_and, "promote", (I32, I64, B), arr),
    "bitwise_or": (np.bitwise_or, "promote", (I32, I64, B), arr),
    "bitwise_xor": (np.bitwise_xor, "promote", (I32, I64, B), arr),
    "logaddexp": (_in_float64(np.logaddexp), "float", ALL, arr),
    "logaddexp2": (_in_float64(np.logaddexp2), "float", ALL, arr),
    "hypot": (np.hypot, "promote", FLOATS, arr),
    "copysign": (_in_float64(np.copysign), "float", ALL, arr),
    "xlogy": (lambda a, b: np.where(a == 0, 0.0, a * np.log(np.asarray(b, np.float64))), "float", ALL, pos),
    "clamp_min": (np.maximum, "promote", NUMERIC, arr),
    "clamp_max": (np.minimum, "promote", NUMERIC, arr),
}
MIRROR = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}
OPERATOR = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "eq": "==", "ne": "!=",
            "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "remainder": "%", "floor_divide": "//",
            "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


def binary_result(name: str, a, b) -> str | None:
    """The result dtype of `name` on these operands; None where the op refuses their common
    dtype (bitwise ops on floats, hypot on integers): sample() then files nothing."""
    _, rule, dtypes, _ = BINARY[name]
    common = torch_result_type(a, b)
    if common not in dtypes:
        return None
    return {"promote": common, "float": floating(common), "bool": B, "logical": B}[rule]


def _binary_samples():
    for name, (ref, rule, dtypes, domain) in BINARY.items():
        fn = getattr(tc, name)
        # same dtype, every dtype the op allows
        for d in dtypes:
            x, y = arr((2, 3), d), domain((2, 3), d)
            if name == "pow" and d in FLOATS:
                x = pos((2, 3), d)
            sample(name, fn, [x, y], ref, binary_result(name, x, y), f"tc.{name}({d}, {d})")
        # method, broadcasting (4,1) with (3,), mixed dtypes, 0-d operands
        x, y = (pos if name == "pow" else arr)((4, 1), F32), domain((3,), F64)
        sample(name, lambda a, b, n=name: getattr(a, n)(b), [x, y], ref, binary_result(name, x, y),
               f"x.{name}(y) (4,1)f32 with (3,)f64")
        x, y = arr((3,), I32, 1, 4), domain((2, 3), F32)
        sample(name, fn, [x, y], ref, binary_result(name, x, y), f"tc.{name}(int32, float32) bcast")
        x, y = (pos if name == "pow" else arr)((2, 2), F32), domain((), F64)
        sample(name, fn, [x, y], ref, binary_result(name, x, y), "float32 with 0-d float64")
        x, y = arr((3,), I32, 1, 4), domain((), I64)
        sample(name, fn, [x, y], ref, binary_result(name, x, y), "int32 with 0-d int64")
        x, y = arr((3,), I32, 1, 4), domain((), F64)
        sample(name, fn, [x, y], ref, binary_result(name, x, y), "int32 with 0-d float64")
        # Python scalars: int, float and bool, on either side
        for d, s in ((F32, 2), (I32, 2), (I32, 2.5), (B, 1), (I64, True), (F64, 0.5)):
            if name in ("sub", "pow") and d == B:
                continue
            x = (pos if name in ("pow", "div") else arr)((5,), d)
            sample(name, lambda a, n=name, s=s: getattr(tc, n)(a, s), [x],
                   lambda a, s=s, r=ref: r(a, s), binary_result(name, x, s), f"tc.{name}({d}, {s!r})")
        if name in OPERATOR:
            sym = OPERATOR[name]
            x, y = (pos if name == "pow" else arr)((3, 2), F32), domain((3, 2), F32)
            sample(name, eval(f"lambda a, b: a {sym} b"), [x, y], ref, binary_result(name, x, y),
                   f"x {sym} y")
            x = (pos if name == "pow" else arr)((3,), I32, 1, 4)
            # Python turns `3 < x` into `x > 3`: the sample belongs to the mirrored op
            sample(MIRROR.get(name, name), eval(f"lambda a: 3 {sym} a"), [x], lambda a, r=ref: r(3, a),
                   binary_result(name, 3, x), f"3 {sym} x int32")
            x = (pos if name == "pow" else arr)((3,), F32)
            sample(name, eval(f"lambda a: a {sym} 1.5"), [x], lambda a, r=ref: r(a, 1.5),
                   binary_result(name, x, 1.5), f"x {sym} 1.5")

    sample("add", lambda a, b: tc.add(a, b, alpha=2), [arr((3,), F32), arr((3,), F32)],
           lambda a, b: a + 2 * b, F32, "alpha=2")
    sample("add", lambda a, b: a.add(b, alpha=0.5), [arr((2, 2), F64), arr((2,), F64)],
           lambda a, b: a + 0.5 * b, F64, "x.add(y, alpha=0.5)")
    sample("add", lambda a, b: a.add(b, alpha=3), [arr((3,), I32), arr((3,), I32)],
           lambda a, b: a + 3 * b, I32, "int alpha=3")
    sample("add", lambda a: a + a, [arr((4,), B)], lambda a: a | a, B, "bool + bool")
    sample("add", lambda a: np.float64(2.0) + a, [arr((3,), F32)], lambda a: a + 2, F32,
           "np.float64 scalar + x")
    sample("sub", lambda a, b: tc.sub(a, b, alpha=2), [arr((3,), F32), arr((3,), F32)],
           lambda a, b: a - 2 * b, F32, "alpha=2")
    sample("sub", lambda a, b: a.sub(b, alpha=-1), [arr((3, 1), I64), arr((2,), I64)],
           lambda a, b: a + b, I64, "x.sub(y, alpha=-1) int64")
    sample("div", tc.div, [edge(F32), np.array([0.0, 0.0, 0.0, -0.0, 2, 2, 2, 2, 2, 0, 1, 1], F32)],
           np.divide, F32, "by zero, inf, nan")
    sample("div", tc.div, [np.array([7, -7, 0, 1], I32), np.array([2, 2, 3, -4], I32)],
           np.divide, F32, "int / int is true division")
    ints = [np.array([7, -7, 7, -7, 0, 9], I64), np.array([2, 2, -2, -2, 3, 3], I64)]
    sample("div.Tensor_mode", lambda a, b: tc.div(a, b, rounding_mode="trunc"), ints,
           lambda a, b: np.trunc(a / b).astype(np.int64), I64, "trunc, int64")
    sample("div.Tensor_mode", lambda a, b: a.div(b, rounding_mode="floor"), ints, np.floor_divide, I64,
           "x.div(y, rounding_mode='floor') int64")
    sample("div.Tensor_mode", lambda a, b: tc.div(a, b, rounding_mode="trunc"), [arr((5,), F64), pos((5,), F64)],
           lambda a, b: np.trunc(a / b), F64, "trunc, f64")
    sample("div.Tensor_mode", lambda a, b: tc.div(a, b, rounding_mode="floor"), [arr((5,), F32), arr((5,), F32, 0.5, 2)],
           np.floor_divide, F32, "floor, f32")
    sample("div.Tensor_mode", lambda a, b: tc.div(a, b, rounding_mode=None), [arr((4,), F32), pos((4,), F32)],
           np.divide, F32, "rounding_mode=None")
    sample("div.Scalar_mode", lambda a: tc.div(a, 2, rounding_mode="floor"), [arr((5,), I32, -9, 9)],
           lambda a: np.floor_divide(a, 2), I32, "int32 by 2, floor")
    sample("div.Scalar_mode", lambda a: a.div(-2.5, rounding_mode="trunc"), [arr((5,), F64)],
           lambda a: np.trunc(a / -2.5), F64, "x.div(-2.5, rounding_mode='trunc')")
    sample("pow", tc.pow, [np.array([2, 3, -2, 0], I64), np.array([3, 0, 3, 5], I64)],
           np.power, I64, "int ** int")
    sample("pow", lambda a: a ** 0.5, [pos((4,), F32)], np.sqrt, F32, "x ** 0.5")
    sample("pow", lambda a: a.pow(-1), [pos((4,), F64)], lambda a: 1 / a, F64, "x.pow(-1)")
    sample("pow", lambda a: 2 ** a, [arr((4,), I32, 0, 5)], lambda a: 2 ** a, I32, "2 ** int32")
    for name in ("maximum", "minimum"):
        sample(name, getattr(tc, name), [np.array([1.0, np.nan, -np.inf, 0.0], F32),
                                         np.array([np.nan, 2.0, 1.0, -0.0], F32)],
               getattr(np, name), F32, "nan propagates")
    sample("atan2", tc.atan2, [np.array([0.0, 0.0, 1.0, -1.0, -0.0], F64),
                               np.array([1.0, -1.0, 0.0, 0.0, -1.0], F64)], np.arctan2, F64, "axes")
    sample("eq", tc.eq, [np.array([1.0, np.nan, 0.0], F32), np.array([1.0, np.nan, -0.0], F32)],
           np.equal, B, "nan != nan, 0 == -0")
    sample("gt", lambda a: 2 < a, [arr((4,), F32)], lambda a: 2 < a, B, "2 < x is x > 2")
    sample("eq", lambda a: a == 2.5, [np.array([2, 3], I32)], lambda a: a == 2.5, B,
           "int32 == 2.5 compares as float")


_binary_samples()


# ---------------------------------------------------------------- where, clamp

def _where_samples():
    c, x, y = arr((2, 3), B), arr((2, 3), F32), arr((2, 3), F32)
    sample("where.self", tc.where, [c, x, y], np.where, F32, "tc.where(c, x, y)")
    sample("where.self", lambda c, x, y: x.where(c, y), [c, x, y], np.where, F32, "x.where(c, y)")
    c, x, y = arr((3, 1), B), arr((4,), I32), arr((1, 4), F64)
    sample("where.self", tc.where, [c, x, y], np.where, F64, "broadcast, int32/float64")
    c, x = arr((5,), B), arr((5,), I64)
    sample("where.self", lambda c, x: tc.where(c, x, 0.5), [c, x], lambda c, x: np.where(c, x, 0.5),
           F32, "int64 tensor, 0.5 scalar")
    sample("where.self", lambda c: tc.where(c, 1.0, 0.0), [c], lambda c: np.where(c, 1.0, 0.0), F32,
           "two scalars")
    sample("where.self", lambda c, x: tc.where(c > 0, x, -x), [arr((4,), F32), arr((4,), F32)],
           lambda c, x: np.where(c > 0, x, -x), F32, "condition from a comparison")
    sample("where.self", lambda c, x: tc.where(c, x, 7), [c, arr((5,), I32)],
           lambda c, x: np.where(c, x, 7), I32, "int32 tensor, int scalar")

    x = arr((3, 4), F32)
    sample("clamp", lambda x: tc.clamp(x, -1, 1), [x], lambda x: np.clip(x, -1, 1), F32, "tc.clamp(x, -1, 1)")
    sample("clamp", lambda x: x.clamp(min=0.5), [x], lambda x: np.maximum(x, 0.5), F32, "x.clamp(min=0.5)")
    sample("clamp", lambda x: x.clamp(max=0), [arr((6,), I32)], lambda x: np.minimum(x, 0), I32,
           "int32 x.clamp(max=0)")
    sample("clamp", lambda x: tc.clamp(x), [x], lambda x: x, F32, "no bounds")
    lo, hi = arr((4,), F32, -2, 0), arr((3, 1), F32, 0, 2)
    sample("clamp", lambda x, lo, hi: tc.clamp(x, lo, hi), [x, lo, hi],
           lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), F32, "tensor bounds, broadcast")
    sample("clamp", lambda x: tc.clamp(x, min=0.5), [arr((5,), I64)],
           lambda x: np.maximum(x, 0.5), F32, "int64 with a float bound promotes")
    sample("clamp", lambda x: tc.clamp(x, min=-1.0, max=1.0), [edge(F64)],
           lambda x: np.minimum(np.maximum(x, -1.0), 1.0), F64, "edge values")


_where_samples()


# ---------------------------------------------------------------- ternary elementwise, glu

def _ternary_samples():
    def lerp(a, b, w):
        return np.where(np.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))
    a, b, w = arr((2, 3), F32), arr((2, 3), F32), arr((2, 3), F32, 0, 1)
    sample("lerp", tc.lerp, [a, b, w], lerp, F32, "tc.lerp(a, b, w)")
    sample("lerp", lambda a, b, w: a.lerp(b, w), [arr((3, 1), F64), arr((4,), F64), arr((3, 4), F64, -1, 2)],
           lerp, F64, "x.lerp(end, weight) broadcast f64")
    sample("lerp", lambda a, b: tc.lerp(a, b, 0.25), [arr((5,), F32), arr((5,), F32)],
           lambda a, b: lerp(a, b, 0.25), F32, "scalar weight")
    sample("lerp", tc.lerp, [arr((4,), F64), arr((4,), F64), np.array([0.0, 1.0, 0.5, 0.49])],
           lerp, F64, "weights 0 and 1 are exact")
    for name, fn in (("addcmul", lambda s, t1, t2, v=1: s + v * t1 * t2),
                     ("addcdiv", lambda s, t1, t2, v=1: s + v * t1 / t2)):
        t2 = (pos if name == "addcdiv" else arr)
        sample(name, getattr(tc, name), [arr((2, 3), F32), arr((2, 3), F32), t2((2, 3), F32)], fn, F32,
               f"tc.{name}(s, t1, t2)")
        sample(name, lambda s, a, b, n=name: getattr(s, n)(a, b, value=0.5),
               [arr((3, 1), F64), arr((4,), F64), t2((3, 4), F64)], lambda s, a, b, f=fn: f(s, a, b, 0.5),
               F64, f"x.{name}(t1, t2, value=0.5) broadcast f64")
    sample("addcmul", lambda s, a, b: tc.addcmul(s, a, b, value=2), [arr((4,), I64), arr((4,), I64), arr((4,), I64)],
           lambda s, a, b: s + 2 * a * b, I64, "int64, value=2")
    sample("glu", tc.glu, [arr((3, 4), F32)], lambda x: x[:, :2] / (1 + np.exp(-x[:, 2:])), F32, "tc.glu(x)")
    sample("glu", lambda x: tc.glu(x, 0), [arr((4, 3), F64)], lambda x: x[:2] / (1 + np.exp(-x[2:])), F64,
           "dim=0 f64")


_ternary_samples()


# ---------------------------------------------------------------- reductions

def _np_reduce(fn, dim=None, keepdim=False, **kw):
    def ref(x):
        axis = tuple(range(np.ndim(x))) if dim is None or dim == () else dim
        return fn(x, axis=axis, keepdims=keepdim, **kw)
    return ref


def _reduction_samples():
    x3 = arr((2, 3, 4), F32)
    for name, fn, intout in (("sum", np.sum, I64), ("prod", np.prod, I64), ("mean", np.mean, None)):
        t = getattr(tc, name)
        sample(name, lambda x, n=name: getattr(x, n)(), [x3], _np_reduce(fn), F32, f"x.{name}()")
        sample(name, lambda x, t=t: t(x, dim=1), [x3], _np_reduce(fn, 1), F32, f"tc.{name}(x, dim=1)")
        sample(name, lambda x, t=t: t(x, (0, 2), True), [x3], _np_reduce(fn, (0, 2), True), F32,
               "dims (0, 2), keepdim")
        sample(name, lambda x, n=name: getattr(x, n)(-1, keepdim=True), [arr((3, 2), F64)],
               _np_reduce(fn, -1, True), F64, "dim=-1 keepdim f64")
        sample(name, lambda x, t=t: t(x, dim=()), [arr((2, 2), F64)], _np_reduce(fn), F64, "dim=() is all")
        sample(name, lambda x, t=t: t(x, dim=0), [np.array(1.5, F32)], lambda x, fn=fn: fn(x), F32, "0-d, dim=0")
        sample(name, lambda x, t=t: t(x, dim=1, dtype=tc.float64), [x3], _np_reduce(fn, 1), F64,
               "dtype=float64")
        if intout:
            sample(name, lambda x, t=t: t(x), [arr((2, 3), I32, -3, 4)], _np_reduce(fn), intout, "int32 -> int64")
            sample(name, lambda x, t=t: t(x, 0), [arr((3, 4), B)], _np_reduce(fn, 0), intout, "bool -> int64")
            sample(name, lambda x, t=t: t(x, 1, dtype=tc.int32), [arr((2, 3), I64)], _np_reduce(fn, 1),
                   I32, "dtype=int32")
        else:
            sample(name, lambda x, t=t: t(x, 0, dtype=tc.float32), [arr((3, 2), I32)], _np_reduce(fn, 0),
                   F32, "int32 with dtype=float32")
    sample("sum", lambda x: x.sum(1), [np.zeros((2, 0), F32)], _np_reduce(np.sum, 1), F32, "empty dim")
    sample("prod", lambda x: x.prod(), [np.zeros((0,), I32)], _np_reduce(np.prod), I64, "empty -> 1")
    sample("mean", lambda x: x.mean(0), [edge(F64).reshape(3, 4)], _np_reduce(np.mean, 0), F64,
           "inf and nan")

    for name, fn in (("amax", np.max), ("amin", np.min)):
        t = getattr(tc, name)
        sample(name, lambda x, n=name: getattr(x, n)(), [x3], _np_reduce(fn), F32, f"x.{name}() all")
        sample(name, lambda x, t=t: t(x, 1), [x3], _np_reduce(fn, 1), F32, "dim=1")
        sample(name, lambda x, t=t: t(x, (-1, 0), keepdim=True), [x3], _np_reduce(fn, (-1, 0), True), F32,
               "dims (-1, 0) keepdim")
        for d in (I32, I64, B, F64):
            sample(name, lambda x, t=t: t(x, dim=0), [arr((3, 2), d)], _np_reduce(fn, 0), d, f"{d}")
        sample(name, lambda x, t=t: t(x, 0), [np.array([[1.0, np.nan], [-np.inf, 2.0]], F32)],
               _np_reduce(fn, 0), F32, "nan propagates")

    for name, fn in (("all", np.all), ("any", np.any)):
        t = getattr(tc, name)
        for d in ALL:
            x = arr((3, 4), d, -1, 2)
            sample(name, t, [x], _np_reduce(fn), B, f"tc.{name}({d})")
        sample(name, lambda x, n=name: getattr(x, n)(dim=1, keepdim=True), [arr((3, 2), B)],
               _np_reduce(fn, 1, True), B, "dim=1 keepdim")
        sample(name, lambda x, t=t: t(x, (0, 1)), [arr((2, 3, 2), B)], _np_reduce(fn, (0, 1)), B, "dims (0, 1)")
        sample(name, lambda x, t=t: t(x), [np.zeros((0,), B)], _np_reduce(fn), B, "empty")
        sample(name, lambda x, t=t: t(x, 0), [np.array([np.nan, 0.0], F32)], _np_reduce(fn, 0), B, "nan is true")

    for name, fn in (("max", np.max), ("min", np.min)):
        t = getattr(tc, name)
        sample(name, lambda x, n=name: getattr(x, n)(), [x3], _np_reduce(fn), F32, f"x.{name}()")
        sample(name, t, [arr((4,), I32)], _np_reduce(fn), I32, f"tc.{name}(int32)")
        sample(name, t, [np.array(3.0, F64)], lambda x: x, F64, "0-d")
        sample(name, t, [arr((3,), B)], _np_reduce(fn), B, "bool")

    for name, arg, fn in (("max", np.argmax, np.max), ("min", np.argmin, np.min)):
        t = getattr(tc, name)

        def ref(x, d=1, keep=False, arg=arg, fn=fn):
            return fn(x, axis=d, keepdims=keep), arg(x, axis=d, keepdims=keep)
        x = distinct((3, 4))
        sample(f"{name}.dim", lambda x, n=name: getattr(x, n)(dim=1), [x], ref, (F32, I64), f"x.{name}(dim=1)")
        sample(f"{name}.dim", lambda x, t=t: t(x, -2, keepdim=True), [x],
               lambda x, ref=ref: ref(x, -2, True), (F32, I64), "dim=-2 keepdim")
        sample(f"{name}.dim", lambda x, t=t: t(x, 0).values, [distinct((5,), I32)],
               lambda x, fn=fn: fn(x, axis=0), I32, ".values of int32")
        sample(f"{name}.dim", lambda x, t=t: t(x, 0).indices, [distinct((2, 3), F64)],
               lambda x, arg=arg: arg(x, axis=0), I64, ".indices")
        sample(f"{name}.dim", lambda x, t=t: t(x, 0), [np.array(2.0, F32)], lambda x: (x, np.int64(0)),
               (F32, I64), "0-d")
        sample(f"{name}.other", t, [arr((3,), F32), arr((2, 1), F32)],
               np.maximum if name == "max" else np.minimum, F32, f"tc.{name}(x, y) bcast")
        sample(f"{name}.other", lambda a, b, n=name: getattr(a, n)(b), [arr((4,), I32), arr((4,), F32)],
               np.maximum if name == "max" else np.minimum, F32, f"x.{name}(y) int32/float32")
        sample(f"{name}.other", lambda a, n=name: getattr(tc, n)(a, np.array(0, np.int64)), [arr((4,), I32)],
               lambda a, n=name: np.maximum(a, 0) if n == "max" else np.minimum(a, 0), I32,
               "with a 0-d int64 array")

    for name, fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        t = getattr(tc, name)
        x = distinct((3, 4))
        sample(name, lambda x, n=name: getattr(x, n)(), [x], lambda x, fn=fn: np.int64(fn(x)), I64,
               f"x.{name}() flat")
        sample(name, lambda x, t=t: t(x, dim=1), [x], lambda x, fn=fn: fn(x, axis=1), I64, "dim=1")
        sample(name, lambda x, t=t: t(x, dim=0, keepdim=True), [distinct((2, 3), I32)],
               lambda x, fn=fn: fn(x, axis=0, keepdims=True), I64, "dim=0 keepdim int32")
        sample(name, lambda x, t=t: t(x, keepdim=True), [x],
               lambda x, fn=fn: np.int64(fn(x)).reshape(1, 1), I64, "no dim, keepdim")
        sample(name, lambda x, t=t: t(x, -1), [np.array([1.0, 3.0, 3.0, -1.0], F64)],
               lambda x, fn=fn: fn(x, axis=-1), I64, "ties: first index")

    for name, fn in (("var", np.var), ("std", np.std)):
        t = getattr(tc, name)
        sample(name, lambda x, n=name: getattr(x, n)(), [x3], _np_reduce(fn, ddof=1), F32, f"x.{name}()")
        sample(name, lambda x, t=t: t(x, 1), [x3], _np_reduce(fn, 1, ddof=1), F32, "dim=1")
        sample(name, lambda x, t=t: t(x, (0, 2), correction=0, keepdim=True), [x3],
               _np_reduce(fn, (0, 2), True, ddof=0), F32, "correction=0 keepdim")
        sample(name, lambda x, n=name: getattr(x, n)(dim=-1, correction=2), [arr((2, 5), F64)],
               _np_reduce(fn, -1, ddof=2), F64, "correction=2 f64")
        sample(f"{name}.dim", lambda x, t=t: t(x, 1, False, True), [x3], _np_reduce(fn, 1, True, ddof=0), F32,
               "(dim, unbiased=False, keepdim=True)")
        sample(f"{name}.dim", lambda x, n=name: getattr(x, n)(dim=(0, 1), unbiased=True), [x3],
               _np_reduce(fn, (0, 1), ddof=1), F32, f"x.{name}(dim=, unbiased=True)")
        sample(f"{name}.unbiased", lambda x, t=t: t(x, False), [x3], _np_reduce(fn, ddof=0), F32, "unbiased=False")
        sample(f"{name}.unbiased", lambda x, n=name: getattr(x, n)(unbiased=True), [arr((7,), F64)],
               _np_reduce(fn, ddof=1), F64, f"x.{name}(unbiased=True)")

    sample("logsumexp", lambda x: x.logsumexp(1), [x3[0]],
           lambda x: np.log(np.sum(np.exp(x), axis=1)), F32, "x.logsumexp(1)")
    sample("logsumexp", lambda x: tc.logsumexp(x, (0, 1), keepdim=True), [arr((2, 3), F64, -50, 50)],
           lambda x: np.log(np.sum(np.exp(x), axis=(0, 1), keepdims=True)), F64, "dims, keepdim, wide range")
    sample("logsumexp", lambda x: tc.logsumexp(x, 0), [np.array([[-np.inf, 1.0], [-np.inf, 2.0]], F32)],
           lambda x: np.log(np.sum(np.exp(x), axis=0)), F32, "all -inf column")
    sample("logsumexp", lambda x: tc.logsumexp(x, -1), [arr((2, 3), I32)],
           lambda x: np.log(np.sum(np.exp(x), axis=-1)), F32, "int32 -> float32")
    sample("logsumexp", lambda x: tc.logsumexp(x, 0), [np.array([1000.0, 1000.0], F32)],
           lambda x: np.float64(1000 + math.log(2)), F32, "large values do not overflow")


_reduction_samples()


# ---------------------------------------------------------------- matmul

def _matmul_samples():
    for a, b, desc in (((2, 3), (3, 4), "2-D @ 2-D"), ((3,), (3, 2), "1-D @ 2-D"),
                       ((2, 3), (3,), "2-D @ 1-D"), ((4,), (4,), "1-D @ 1-D"),
                       ((2, 2, 3), (3, 4), "batched @ 2-D"), ((2, 1, 3, 4), (5, 4, 2), "batch broadcast"),
                       ((3,), (2, 3, 2), "1-D @ batched")):
        x, y = arr(a), arr(b)
        sample("matmul", tc.matmul, [x, y], np.matmul, F32, f"tc.matmul {desc}", atol=1e-5)
    sample("matmul", lambda a, b: a @ b, [arr((3, 2), F64), arr((2, 3), F64)], np.matmul, F64, "a @ b f64")
    sample("matmul", lambda a, b: a.matmul(b), [arr((2, 3), I32), arr((3, 2), I32)], np.matmul, I32,
           "a.matmul(b) int32")
    sample("matmul", tc.matmul, [arr((2, 3), I64), arr((3,), I64)], np.matmul, I64, "int64")
    sample("matmul", tc.matmul, [arr((2, 0)), arr((0, 3))], np.matmul, F32, "empty inner dim")
    w = arr((2, 3), F64)
    sample("matmul", lambda b: w @ b, [arr((3, 2), F64)], lambda b: w @ b, F64, "ndarray @ b (__rmatmul__)")
    sample("mm", tc.mm, [arr((2, 3)), arr((3, 4))], np.matmul, F32, "tc.mm", atol=1e-5)
    sample("mm", lambda a, b: a.mm(b), [arr((1, 2), F64), arr((2, 2), F64)], np.matmul, F64, "a.mm(b)")
    sample("mm", tc.mm, [arr((3, 2), I32), arr((2, 1), I32)], np.matmul, I32, "tc.mm int32")
    sample("bmm", tc.bmm, [arr((2, 2, 3)), arr((2, 3, 4))], np.matmul, F32, "tc.bmm", atol=1e-5)
    sample("bmm", tc.bmm, [arr((1, 3, 2), F64), arr((1, 2, 2), F64)], np.matmul, F64, "tc.bmm f64")
    sample("bmm", lambda a, b: a.bmm(b), [arr((3, 1, 2), I64), arr((3, 2, 2), I64)], np.matmul, I64,
           "a.bmm(b) int64")


_matmul_samples()


# ---------------------------------------------------------------- nn composites

def _softmax(x, dim):
    e = np.exp(x - np.max(x, axis=dim, keepdims=True))
    return e / np.sum(e, axis=dim, keepdims=True)


def _log_softmax(x, dim):
    s = x - np.max(x, axis=dim, keepdims=True)
    return s - np.log(np.sum(np.exp(s), axis=dim, keepdims=True))


def _layer_norm(x, n, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - n, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps)
    out = out if w is None else out * w
    return out if b is None else out + b


def _cross_entropy(logits, target, reduction="mean"):
    logp = _log_softmax(logits, -1)
    picked = logp[target] if logits.ndim == 1 else logp[np.arange(len(target)), target]
    loss = -picked
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](loss)


def _nn_samples():
    x = arr((3, 5))
    tol = dict(rtol=1e-5, atol=1e-6)
    for name, ref in (("softmax", _softmax), ("log_softmax", _log_softmax)):
        t = getattr(tc, name)
        sample(name, lambda x, t=t: t(x, -1), [x], lambda x, r=ref: r(x, -1), F32, f"tc.{name}(x, -1)", **tol)
        sample(name, lambda x, n=name: getattr(x, n)(0), [x], lambda x, r=ref: r(x, 0), F32,
               f"x.{name}(0)", **tol)
        sample(name, lambda x, t=t: t(x, 1, dtype=tc.float64), [arr((2, 3, 2))], lambda x, r=ref: r(x, 1), F64,
               "dtype=float64")
        sample(name, lambda x, t=t: t(x, 0), [np.array([1000.0, 0.0, -1000.0], F64)],
               lambda x, r=ref: r(x, 0), F64, "large logits are stable")
    w, b = arr((5,)), arr((5,))
    sample("layer_norm", lambda x: tc.layer_norm(x, (5,)), [x], lambda x: _layer_norm(x, 1), F32,
           "no affine", rtol=1e-4, atol=1e-5)
    sample("layer_norm", lambda x, w, b: tc.layer_norm(x, [5], w, b), [x, w, b],
           lambda x, w, b: _layer_norm(x, 1, w, b), F32, "weight and bias", rtol=1e-4, atol=1e-5)
    sample("layer_norm", lambda x, w: tc.layer_norm(x, (3, 4), weight=w, eps=1e-3), [arr((2, 3, 4), F64),
           arr((3, 4), F64)], lambda x, w: _layer_norm(x, 2, w, eps=1e-3), F64, "2 dims, weight, eps")
    sample("layer_norm", lambda x, b: tc.layer_norm(x, (4,), bias=b), [arr((4,), F64), arr((4,), F64)],
           lambda x, b: _layer_norm(x, 1, b=b), F64, "1-D, bias only")

    w, b = arr((4, 5)), arr((4,))
    sample("linear", tc.linear, [x, w, b], lambda x, w, b: x @ w.T + b, F32, "with bias", atol=1e-5)
    sample("linear", tc.linear, [x, w], lambda x, w: x @ w.T, F32, "no bias", atol=1e-5)
    sample("linear", lambda x, w: tc.linear(x, w, None), [arr((5,), F64), arr((2, 5), F64)],
           lambda x, w: x @ w.T, F64, "1-D input, bias=None")
    sample("linear", tc.linear, [arr((2, 3, 5)), w, arr((4,))], lambda x, w, b: x @ w.T + b, F32,
           "batched input", atol=1e-5)

    p, q = arr((3, 4)), arr((3, 4))
    for red, fn in (("mean", np.mean), ("sum", np.sum), ("none", lambda v: v)):
        sample("mse_loss", lambda p, q, r=red: tc.mse_loss(p, q, reduction=r), [p, q],
               lambda p, q, fn=fn: fn((p - q) ** 2), F32, f"reduction={red}", rtol=1e-5, atol=1e-5)
    sample("mse_loss", tc.mse_loss, [arr((5,), F64), arr((5,), F64)], lambda p, q: np.mean((p - q) ** 2),
           F64, "default mean f64")
    sample("mse_loss", tc.mse_loss, [arr((2, 3), F32), arr((3,), F32)], lambda p, q: np.mean((p - q) ** 2),
           F32, "broadcast target")

    logits, target = arr((4, 5)), np.array([0, 4, 2, 2], np.int64)
    for red in ("mean", "sum", "none"):
        sample("cross_entropy", lambda l, t, r=red: tc.cross_entropy(l, t, reduction=r), [logits, target],
               lambda l, t, r=red: _cross_entropy(l, t, r), F32, f"reduction={red}", rtol=1e-5, atol=1e-5)
    sample("cross_entropy", tc.cross_entropy, [arr((3, 2), F64), np.array([1, 0, 1], np.int32)],
           _cross_entropy, F64, "int32 targets f64")
    sample("cross_entropy", tc.cross_entropy, [arr((5,), F32), np.array(3, np.int64)],
           _cross_entropy, F32, "1-D logits, 0-d target", rtol=1e-5, atol=1e-5)


def _nll(logp, target, weight=None, ignore=-100, reduction="mean"):
    """nll_loss over class dim 1 (0 for 1-D input), in NumPy."""
    c = 1 if logp.ndim > 1 else 0
    valid = target != ignore
    safe = np.where(valid, target, 0)
    picked = np.take_along_axis(logp, np.expand_dims(safe, c), c).squeeze(c)
    w = (np.ones(logp.shape[c]) if weight is None else weight)[safe] * valid
    loss = -picked * w
    return loss.sum() / w.sum() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _soft_ce(logits, p, weight=None, smoothing=0.0):
    c = 1 if logits.ndim > 1 else 0
    n = logits.shape[c]
    p = p * (1 - smoothing) + smoothing / n
    w = 1 if weight is None else weight.reshape([n] + [1] * max(logits.ndim - 2, 0))
    return np.mean(-(w * _log_softmax(logits, c) * p).sum(c))


def _smoothed_ce(logits, target, weight=None, smoothing=0.0):
    logp = _log_softmax(logits, 1)
    n = logits.shape[1]
    w = np.ones(n) if weight is None else weight
    valid = target != -100
    smooth = np.where(valid, -(logp * w).sum(1), 0).sum() / (w[np.where(valid, target, 0)] * valid).sum()
    return (1 - smoothing) * _nll(logp, target, weight) + smoothing / n * smooth


def _more_loss_samples():
    tol = dict(rtol=1e-5, atol=1e-6)
    logp = _log_softmax(arr((5, 4), F64), 1)
    t, w = np.array([0, 3, -100, 1, 2]), pos((4,), F64)
    sample("nll_loss", tc.nll_loss, [logp, t], _nll, F64, "ignore_index -100")
    sample("nll_loss", lambda x, t, w: tc.nll_loss(x, t, w, reduction="sum"), [logp, t, w],
           lambda x, t, w: _nll(x, t, w, reduction="sum"), F64, "weight, sum")
    sample("nll_loss", lambda x, t: tc.nll_loss(x, t, ignore_index=1, reduction="none"),
           [logp.astype(F32), np.array([0, 1, 1, 3, 2])], lambda x, t: _nll(x, t, ignore=1, reduction="none"),
           F32, "ignore_index=1, none", **tol)
    sample("nll_loss", tc.nll_loss, [arr((2, 3, 4), F64), np.array([[0, 2, 1, 1], [2, 2, 0, 1]])],
           _nll, F64, "(N, C, d) input")
    logits = arr((5, 4), F64)
    sample("cross_entropy", lambda l, t, w: tc.cross_entropy(l, t, w), [logits, t, w],
           lambda l, t, w: _nll(_log_softmax(l, 1), t, w), F64, "weight and an ignored target")
    sample("cross_entropy", lambda l, t: tc.cross_entropy(l, t, label_smoothing=0.2), [logits, t],
           lambda l, t: _smoothed_ce(l, t, smoothing=0.2), F64, "label_smoothing=0.2")
    sample("cross_entropy", lambda l, t, w: tc.cross_entropy(l, t, w, label_smoothing=0.1), [logits, t, w],
           lambda l, t, w: _smoothed_ce(l, t, w, 0.1), F64, "weight and label_smoothing")
    probs = np.random.default_rng(3).dirichlet(np.ones(4), 5)
    sample("cross_entropy", tc.cross_entropy, [logits, probs], _soft_ce, F64, "class probabilities")
    sample("cross_entropy", lambda l, p, w: tc.cross_entropy(l, p, w, label_smoothing=0.3), [logits, probs, w],
           lambda l, p, w: _soft_ce(l, p, w, 0.3), F64, "probabilities, weight, label_smoothing")
    x, y = pos((3, 4), F64, 0.05, 0.95), pos((3, 4), F64, 0.0, 1.0)
    bce = lambda x, y: -(y * np.log(x) + (1 - y) * np.log1p(-x))       # noqa: E731
    sample("binary_cross_entropy", tc.binary_cross_entropy, [x, y], lambda x, y: bce(x, y).mean(), F64, "mean")
    sample("binary_cross_entropy", lambda x, y, w: tc.binary_cross_entropy(x, y, w, reduction="none"),
           [x, y, pos((4,), F64)], lambda x, y, w: bce(x, y) * w, F64, "weight, none")
    sample("binary_cross_entropy", tc.binary_cross_entropy, [np.array([0.0, 1.0], F32), np.array([1.0, 0.0], F32)],
           lambda x, y: np.float64(100.0), F32, "log clamped at -100")
    z = arr((3, 4), F64)
    bcel = lambda z, y, pw=1: (1 - y) * z + (1 + (pw - 1) * y) * np.logaddexp(0, -z)    # noqa: E731
    sample("binary_cross_entropy_with_logits", tc.binary_cross_entropy_with_logits, [z, y],
           lambda z, y: bcel(z, y).mean(), F64, "mean")
    sample("binary_cross_entropy_with_logits",
           lambda z, y, pw: tc.binary_cross_entropy_with_logits(z, y, reduction="sum", pos_weight=pw),
           [z, y, pos((4,), F64)], lambda z, y, pw: bcel(z, y, pw).sum(), F64, "pos_weight, sum")
    sample("binary_cross_entropy_with_logits", tc.binary_cross_entropy_with_logits,
           [np.array([-1000.0, 1000.0], F32), np.array([1.0, 0.0], F32)], lambda z, y: np.float64(1000.0), F32,
           "large logits are stable")
    p, q = arr((3, 4), F32), arr((3, 4), F32)
    for red, fn in (("mean", np.mean), ("sum", np.sum), ("none", lambda v: v)):
        sample("l1_loss", lambda p, q, r=red: tc.l1_loss(p, q, reduction=r), [p, q],
               lambda p, q, fn=fn: fn(np.abs(p - q)), F32, f"reduction={red}", **tol)
    d = lambda p, q: np.abs(p - q)       # noqa: E731
    sample("smooth_l1_loss", tc.smooth_l1_loss, [p, q],
           lambda p, q: np.mean(np.where(d(p, q) < 1, 0.5 * d(p, q) ** 2, d(p, q) - 0.5)), F32, "beta=1", **tol)
    sample("smooth_l1_loss", lambda p, q: tc.smooth_l1_loss(p, q, beta=0.5, reduction="none"),
           [p.astype(F64), q.astype(F64)], lambda p, q: np.where(d(p, q) < 0.5, d(p, q) ** 2, d(p, q) - 0.25),
           F64, "beta=0.5, none")
    sample("smooth_l1_loss", lambda p, q: tc.smooth_l1_loss(p, q, beta=0.0), [p, q],
           lambda p, q: np.mean(d(p, q)), F32, "beta=0 is l1", **tol)
    sample("huber_loss", tc.huber_loss, [p, q],
           lambda p, q: np.mean(np.where(d(p, q) < 1, 0.5 * d(p, q) ** 2, d(p, q) - 0.5)), F32, "delta=1", **tol)
    sample("huber_loss", lambda p, q: tc.huber_loss(p, q, delta=2.0, reduction="sum"), [p.astype(F64), q.astype(F64)],
           lambda p, q: np.sum(np.where(d(p, q) < 2, 0.5 * d(p, q) ** 2, 2 * (d(p, q) - 1))), F64, "delta=2, sum")
    lp, tq = np.log(probs[:3]), probs[2:]
    kl = lambda x, t: np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - x), 0.0)     # noqa: E731
    sample("kl_div", tc.kl_div, [lp, tq], lambda x, t: kl(x, t).mean(), F64, "mean")
    sample("kl_div", lambda x, t: tc.kl_div(x, t, reduction="batchmean"), [lp, tq],
           lambda x, t: kl(x, t).sum() / 3, F64, "batchmean")
    sample("kl_div", lambda x, t: tc.kl_div(x, t, reduction="none", log_target=True), [lp, np.log(tq)],
           lambda x, t: np.exp(t) * (t - x), F64, "log_target, none")


def _product_samples():
    tol = dict(rtol=1e-5, atol=1e-5)
    v, w, m = arr((4,), F32), arr((3,), F32), arr((3, 4), F32)
    sample("outer", tc.outer, [v, w], np.outer, F32, "tc.outer(v, w)")
    sample("outer", lambda a, b: a.outer(b), [arr((2,), I64), arr((3,), I64)], np.outer, I64, "x.outer(y) int64")
    for name in ("dot", "vdot"):
        sample(name, getattr(tc, name), [v, arr((4,), F32)], np.dot, F32, f"tc.{name}(a, b)", **tol)
        sample(name, lambda a, b, n=name: getattr(a, n)(b), [arr((5,), F64), arr((5,), F64)], np.dot, F64,
               f"x.{name}(y) f64")
    sample("mv", tc.mv, [m, v], np.dot, F32, "tc.mv(m, v)", **tol)
    sample("mv", lambda a, b: a.mv(b), [arr((2, 5), F64), arr((5,), F64)], np.dot, F64, "x.mv(v) f64")
    s_, a_, b_ = arr((3, 5), F64), arr((3, 4), F64), arr((4, 5), F64)
    sample("addmm", tc.addmm, [s_, a_, b_], lambda s, a, b: s + a @ b, F64, "tc.addmm(s, a, b)")
    sample("addmm", lambda s, a, b: s.addmm(a, b, beta=0.5, alpha=2), [arr((5,), F64), a_, b_],
           lambda s, a, b: 0.5 * s + 2 * a @ b, F64, "x.addmm(a, b, beta=0.5, alpha=2) broadcast")
    sample("addmm", lambda s, a, b: tc.addmm(s, a, b, beta=0), [np.full((3, 5), np.nan), a_, b_],
           lambda s, a, b: a @ b, F64, "beta=0 ignores NaN in self")
    sample("addmv", tc.addmv, [arr((3,), F64), a_, arr((4,), F64)], lambda s, a, b: s + a @ b, F64, "tc.addmv")
    sample("addmv", lambda s, a, b: s.addmv(a, b, alpha=-1), [arr((3,), F64), a_, arr((4,), F64)],
           lambda s, a, b: s - a @ b, F64, "x.addmv(m, v, alpha=-1)")
    bb1, bb2 = arr((2, 3, 4), F64), arr((2, 4, 5), F64)
    sample("baddbmm", tc.baddbmm, [arr((2, 3, 5), F64), bb1, bb2], lambda s, a, b: s + a @ b, F64, "tc.baddbmm")
    sample("baddbmm", lambda s, a, b: s.baddbmm(a, b, beta=2, alpha=0.5), [arr((3, 5), F64), bb1, bb2],
           lambda s, a, b: 2 * s + 0.5 * (a @ b), F64, "x.baddbmm(...) broadcast self")
    sample("kron", tc.kron, [arr((2, 3), F64), arr((3, 2), F64)], np.kron, F64, "tc.kron 2-D")
    sample("kron", lambda a, b: a.kron(b), [arr((3,), I64), arr((2, 2), I64)], np.kron, I64, "x.kron(y) ranks differ")
    sample("cross", lambda a, b: tc.cross(a, b, dim=1), [arr((4, 3), F64), arr((4, 3), F64)],
           lambda a, b: np.cross(a, b, axis=1), F64, "tc.cross(a, b, dim=1)")
    sample("cross", lambda a, b: a.cross(b), [arr((3, 2), F32), arr((3, 1), F32)],
           lambda a, b: np.cross(a, b, axis=0), F32, "x.cross(y) first dim of size 3, broadcast", **tol)


_nn_samples()
_product_samples()


def _scan_samples():
    sample("cumsum", lambda x: tc.cumsum(x, 1), [arr((3, 4), F32)], lambda x: np.cumsum(x, 1), F32,
           "tc.cumsum(x, 1)", rtol=1e-5, atol=1e-5)
    sample("cumsum", lambda x: x.cumsum(0), [arr((3, 4), F64)], lambda x: np.cumsum(x, 0), F64, "x.cumsum(0) f64")
    sample("cumsum", lambda x: tc.cumsum(x, -2, dtype=tc.float64), [arr((2, 3, 2), F32)],
           lambda x: np.cumsum(x, -2), F64, "dtype=float64, middle dim")
    sample("cumsum", lambda x: tc.cumsum(x, 0), [arr((5,), I32, -9, 9)], lambda x: np.cumsum(x), I64,
           "int32 sums in int64")
    sample("cumsum", lambda x: tc.cumsum(x, 0), [arr((4,), B)], lambda x: np.cumsum(x), I64, "bool")
    sample("cumsum", lambda x: tc.cumsum(x, 0), [np.array(2.5, F32)], lambda x: x, F32, "0-d")
    sample("cumsum", lambda x: tc.cumsum(x, 1), [arr((2, 0), F32)], lambda x: np.cumsum(x, 1), F32, "empty")
    sample("cumsum", lambda x: tc.cumsum(x, 0), [np.array([1.0, np.nan, 2.0, np.inf], F32)],
           lambda x: np.cumsum(x), F32, "nan and inf carry on")

    zeros = np.array([[0.5, 0.0, 2.0, -1.5, 0.0, 3.0], [1.5, -2.0, 0.0, 0.5, 1.0, 2.0]], F64)
    sample("cumprod", lambda x: tc.cumprod(x, 1), [arr((3, 4), F32, 0.5, 1.5)], lambda x: np.cumprod(x, 1), F32,
           "tc.cumprod(x, 1)", rtol=1e-5, atol=1e-5)
    sample("cumprod", lambda x: x.cumprod(1), [zeros], lambda x: np.cumprod(x, 1), F64,
           "zeros: one and two in a row")
    sample("cumprod", lambda x: tc.cumprod(x, 0), [zeros.T.copy()], lambda x: np.cumprod(x, 0), F64, "zeros along dim 0")
    sample("cumprod", lambda x: tc.cumprod(x, 0, dtype=tc.float64), [arr((4,), I32, -3, 3)],
           lambda x: np.cumprod(x).astype(F64), F64, "dtype=float64")
    sample("cumprod", lambda x: tc.cumprod(x, 0), [arr((5,), I32, -3, 3)], lambda x: np.cumprod(x), I64,
           "int32 multiplies in int64")
    sample("cumprod", lambda x: tc.cumprod(x, 0), [np.array(-2.0, F64)], lambda x: x, F64, "0-d")

    def running(fn):
        def ref(x, dim):
            x = np.moveaxis(x, dim, -1)
            values, indices = x.copy(), np.zeros(x.shape, np.int64)
            for i in range(1, x.shape[-1]):
                take = fn(x[..., i], values[..., i - 1]) | np.isnan(x[..., i]).astype(bool)
                values[..., i] = np.where(take, x[..., i], values[..., i - 1])
                indices[..., i] = np.where(take, i, indices[..., i - 1])
            return np.moveaxis(values, -1, dim), np.moveaxis(indices, -1, dim)
        return ref
    for name, fn in (("cummax", np.greater_equal), ("cummin", np.less_equal)):
        ref = running(fn)
        sample(name, lambda x, n=name: getattr(tc, n)(x, 1), [arr((3, 5), F64)], lambda x, r=ref: r(x, 1),
               (F64, I64), f"tc.{name}(x, 1)")
        sample(name, lambda x, n=name: getattr(x, n)(0), [np.array([[1, 3], [3, 1], [2, 3], [3, 0]], I64)],
               lambda x, r=ref: r(x, 0), (I64, I64), "ties: the latest index")
        sample(name, lambda x, n=name: getattr(tc, n)(x, 0), [np.array([1.0, np.nan, 5.0, np.nan, -2.0], F32)],
               lambda x, r=ref: r(x, 0), (F32, I64), "NaN wins, the latest NaN")
        sample(name, lambda x, n=name: getattr(tc, n)(x, 0), [np.array(4.0, F32)],
               lambda x: (x, np.array(0)), (F32, I64), "0-d")
    big = np.array([[-1000.0, 0.0, 1000.0, 999.0], [-np.inf, -np.inf, 2.0, -np.inf]], F64)
    sample("logcumsumexp", lambda x: tc.logcumsumexp(x, 1), [arr((3, 5), F32)],
           lambda x: np.logaddexp.accumulate(x, 1), F32, "tc.logcumsumexp(x, 1)", rtol=1e-5, atol=1e-5)
    sample("logcumsumexp", lambda x: x.logcumsumexp(1), [big], lambda x: np.logaddexp.accumulate(x, 1), F64,
           "far apart and -inf: no overflow")
    sample("logcumsumexp", lambda x: tc.logcumsumexp(x, 0), [arr((4, 2), F64)],
           lambda x: np.logaddexp.accumulate(x, 0), F64, "dim 0")

    nanx = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, 2.0]], F32)
    sample("nansum", tc.nansum, [nanx], np.nansum, F32, "tc.nansum(x)")
    sample("nansum", lambda x: x.nansum(1, keepdim=True), [nanx.astype(F64)], lambda x: np.nansum(x, 1, keepdims=True),
           F64, "x.nansum(1, keepdim=True)")
    sample("nansum", lambda x: tc.nansum(x, 0), [arr((3, 2), I32)], lambda x: np.sum(x, 0), I64, "int32 sums in int64")
    sample("nansum", lambda x: tc.nansum(x, -1), [arr((2, 3), F64)], lambda x: np.sum(x, -1), F64, "no NaN, f64")
    for name, fn in (("var_mean", np.var), ("std_mean", np.std)):
        sample(f"{name}.dim", lambda x, n=name: getattr(tc, n)(x, 0, False), [arr((3, 4), F64)],
               lambda x, f=fn: (f(x, 0), x.mean(0)), (F64, F64), "dim 0, unbiased=False")
        sample(f"{name}.unbiased", lambda x, n=name: getattr(tc, n)(x, True), [arr((5,), F64)],
               lambda x, f=fn: (f(x, ddof=1), x.mean()), (F64, F64), "unbiased=True")
    with np.errstate(all="ignore"):
        sample("nanmean", lambda x: tc.nanmean(x, 0), [nanx], lambda x: np.nanmean(x, 0), F32, "an all-NaN column")
    sample("nanmean", lambda x: x.nanmean(), [arr((2, 3), F64)], np.mean, F64, "x.nanmean() without NaN")
    sample("count_nonzero", tc.count_nonzero, [np.array([[0.0, 1.5, -0.0], [np.nan, 0.0, 2.0]], F32)],
           lambda x: np.count_nonzero(x), I64, "zeros of both signs, NaN counts")
    sample("count_nonzero", lambda x: x.count_nonzero(1), [arr((3, 4), I32, -1, 2)],
           lambda x: np.count_nonzero(x, 1), I64, "x.count_nonzero(1)")
    sample("aminmax", tc.aminmax, [arr((3, 4), F32)], lambda x: (x.min(), x.max()), (F32, F32), "tc.aminmax(x)")
    sample("aminmax", lambda x: x.aminmax(dim=0, keepdim=True), [arr((3, 4), I64)],
           lambda x: (x.min(0, keepdims=True), x.max(0, keepdims=True)), (I64, I64), "x.aminmax(dim=0, keepdim=True)")
    for name, fn in (("var_mean", np.var), ("std_mean", np.std)):
        sample(name, getattr(tc, name), [arr((3, 4), F64)], lambda x, f=fn: (f(x, ddof=1), x.mean()), (F64, F64),
               f"tc.{name}(x)")
        sample(name, lambda x, n=name: getattr(tc, n)(x, 1, correction=0, keepdim=True), [arr((3, 4), F32)],
               lambda x, f=fn: (f(x, 1, keepdims=True), x.mean(1, keepdims=True)), (F32, F32),
               "dim 1, correction=0, keepdim", rtol=1e-5, atol=1e-6)


_scan_samples()


def _stable_order(x, dim=-1, descending=False):
    """NumPy's stable argsort in PyTorch's order: NaN largest, descending keeps ties' order."""
    x = np.moveaxis(np.asarray(x), dim, -1)
    key = x.astype(np.float64) if x.dtype.kind in "biu" else x
    nan = np.isnan(key)
    order = np.lexsort((-key, ~nan) if descending else (key, nan), axis=-1)
    return np.moveaxis(order, -1, dim)


def _sorted(x, dim=-1, descending=False):
    order = _stable_order(x, dim, descending)
    return np.take_along_axis(x, order, dim), order


def _sort_samples():
    ties = np.array([[3, 1, 2, 1, 3, 0], [2, 2, 2, 1, 1, 1]], I64)
    nans = np.array([2.0, np.nan, -1.0, 5.0, np.nan, 0.0, -1.0], F32)
    sample("sort", tc.sort, [arr((4, 9), F32)], _sorted, (F32, I64), "tc.sort(x), last dim")
    sample("sort", lambda x: x.sort(0, True), [arr((33, 3), F64)], lambda x: _sorted(x, 0, True), (F64, I64),
           "x.sort(0, descending=True), 33 rows (6 merge passes)")
    sample("sort", lambda x: tc.sort(x, 1), [ties], lambda x: _sorted(x, 1), (I64, I64), "int ties keep order")
    sample("sort", lambda x: tc.sort(x, 1, True), [ties], lambda x: _sorted(x, 1, True), (I64, I64),
           "descending int ties keep order")
    sample("sort", tc.sort, [nans], _sorted, (F32, I64), "NaN sorts last")
    sample("sort", lambda x: tc.sort(x, descending=True), [nans], lambda x: _sorted(x, -1, True), (F32, I64),
           "NaN sorts first descending")
    sample("sort", tc.sort, [arr((5,), B)], _sorted, (B, I64), "bool")
    sample("sort", tc.sort, [np.array(1.5, F32)], lambda x: (x, np.array(0)), (F32, I64), "0-d")
    sample("sort", lambda x: tc.sort(x, 0), [arr((0, 3), F32)], lambda x: _sorted(x, 0), (F32, I64), "empty")
    sample("sort.stable", lambda x: tc.sort(x, stable=True, dim=0), [ties.T.copy()], lambda x: _sorted(x, 0),
           (I64, I64), "stable=True")
    sample("sort.stable", lambda x: x.sort(stable=True, descending=True), [nans], lambda x: _sorted(x, -1, True),
           (F32, I64), "x.sort(stable=True, descending=True)")
    sample("sort.stable", lambda x: tc.sort(x, stable=False), [arr((3, 4), F64)], _sorted, (F64, I64), "float64")
    sample("argsort", lambda x: tc.argsort(x, 1, True), [arr((3, 17), F32)],
           lambda x: _stable_order(x, 1, True), I64, "tc.argsort(x, 1, descending=True)")
    sample("argsort", lambda x: x.argsort(), [ties], _stable_order, I64, "x.argsort(), ties")
    sample("argsort.stable", lambda x: tc.argsort(x, stable=True), [nans], _stable_order, I64, "stable=True, NaN")
    sample("argsort.stable", lambda x: x.argsort(stable=True, dim=0), [ties], lambda x: _stable_order(x, 0), I64,
           "x.argsort(stable=True, dim=0)")
    sample("msort", tc.msort, [arr((6, 2), F64)], lambda x: np.sort(x, 0), F64, "tc.msort(x)")
    sample("topk", lambda x: tc.topk(x, 3), [arr((4, 7), F32)],
           lambda x: tuple(a[:, :3] for a in _sorted(x, 1, True)), (F32, I64), "tc.topk(x, 3)")
    sample("topk", lambda x: x.topk(2, 0, largest=False), [ties.astype(F64)],
           lambda x: tuple(a[:2] for a in _sorted(x, 0)), (F64, I64), "smallest, dim 0, ties")
    sample("topk", lambda x: tc.topk(x, 0), [arr((3,), F32)], lambda x: (x[:0], np.zeros(0, np.int64)),
           (F32, I64), "k = 0")
    sample("kthvalue", lambda x: tc.kthvalue(x, 2), [arr((3, 5), F32)],
           lambda x: tuple(a[:, 1] for a in _sorted(x, 1)), (F32, I64), "tc.kthvalue(x, 2)")
    sample("kthvalue", lambda x: x.kthvalue(3, 0, keepdim=True), [ties.T.astype(F64)],
           lambda x: tuple(a[2:3] for a in _sorted(x, 0)), (F64, I64), "keepdim, ties")
    sample("median", tc.median, [arr((4, 5), F32)], lambda x: np.sort(x, None)[(x.size - 1) // 2], F32,
           "tc.median(x): the lower middle")
    sample("median", tc.median, [nans], lambda x: np.float32(np.nan), F32, "NaN if any is NaN")
    sample("median", tc.median, [arr((0,), F32)], lambda x: np.float32(np.nan), F32, "empty: NaN")
    sample("median.dim", lambda x: tc.median(x, 1), [arr((3, 6), F64)],
           lambda x: tuple(a[:, 2] for a in _sorted(x, 1)), (F64, I64), "tc.median(x, 1)")
    sample("median.dim", lambda x: x.median(0, keepdim=True), [np.stack([nans, nans[::-1]], 1)],
           lambda x: (np.full((1, 2), np.nan, F32), np.array([[1, 2]])), (F32, I64), "NaN and the first NaN's index")
    seq = np.sort(arr((10,), F32))
    rows = np.sort(arr((2, 6), F64), 1)
    sample("searchsorted.Tensor", tc.searchsorted, [seq, arr((3, 4), F32)], np.searchsorted, I64,
           "tc.searchsorted(seq, values)")
    sample("searchsorted.Tensor", lambda s, v: tc.searchsorted(s, v, right=True), [seq, seq[[0, 3, 3, 9]]],
           lambda s, v: np.searchsorted(s, v, "right"), I64, "right=True, values on the boundaries")
    sample("searchsorted.Tensor", lambda s, v: tc.searchsorted(s, v, side="right", out_int32=True),
           [rows, arr((2, 3), F64)], lambda s, v: np.stack([np.searchsorted(a, b, "right") for a, b in zip(s, v)]),
           I32, "a sequence per row, side='right', int32")
    perm = np.array([3, 0, 4, 1, 2])
    sample("searchsorted.Tensor", lambda s, v, o: tc.searchsorted(s, v, sorter=o),
           [np.array([5, 1, 9, 2, 7], I64), np.array([0, 2, 6, 10], I64), perm],
           lambda s, v, o: np.searchsorted(s, v, sorter=o), I64, "sorter")
    sample("searchsorted.Scalar", lambda s: tc.searchsorted(s, 0.5), [seq], lambda s: np.searchsorted(s, 0.5),
           I64, "a Python number")
    sample("bucketize.Tensor", lambda x, b: tc.bucketize(x, b, right=True), [arr((2, 3), F32), seq],
           lambda x, b: np.searchsorted(b, x, "right"), I64, "tc.bucketize(x, boundaries, right=True)")
    sample("bucketize.Scalar", lambda b: tc.bucketize(3, b), [np.arange(6, dtype=I64)],
           lambda b: np.searchsorted(b, 3), I64, "a Python number")


_sort_samples()


def _norm_samples():
    x, zero = arr((3, 4), F64), np.zeros((2, 3), F64)
    norm = np.linalg.norm
    sample("linalg_vector_norm", lambda a: tc.linalg.vector_norm(a), [x], lambda a: norm(a.ravel()), F64,
           "tc.linalg.vector_norm(x)")
    for ord_ in (1, 3, 0.5, float("inf"), float("-inf"), 0, -1):
        sample("linalg_vector_norm", lambda a, o=ord_: tc.linalg.vector_norm(a, o, 1), [x],
               lambda a, o=ord_: norm(a, o, 1), F64, f"ord={ord_}, dim 1")
    sample("linalg_vector_norm", lambda a: tc.linalg.vector_norm(a, 2, (0, 1), True, dtype=tc.float64),
           [arr((2, 3, 2), F32)], lambda a: np.sqrt((a.astype(F64) ** 2).sum((0, 1), keepdims=True)), F64,
           "dims (0, 1), keepdim, dtype=float64")
    sample("linalg_vector_norm", lambda a: tc.linalg.vector_norm(a, dim=1), [zero], lambda a: norm(a, 2, 1), F64,
           "zeros: the norm 0 and the gradient 0")
    sample("linalg_matrix_norm", lambda a: tc.linalg.matrix_norm(a, 1), [arr((2, 3, 4), F64)],
           lambda a: np.linalg.norm(a, 1, (-2, -1)), F64, "ord=1: the max column sum")
    for ord_ in (-1, float("inf"), float("-inf")):
        sample("linalg_matrix_norm", lambda a, o=ord_: tc.linalg.matrix_norm(a, o, (0, 1), True), [x.copy()],
               lambda a, o=ord_: np.linalg.norm(a, o, (0, 1), True), F64, f"ord={ord_}, keepdim")
    sample("linalg_matrix_norm.str_ord", lambda a: tc.linalg.matrix_norm(a), [arr((2, 3, 4), F64)],
           lambda a: np.linalg.norm(a, "fro", (-2, -1)), F64, "ord='fro'")
    sample("linalg_matrix_norm.str_ord", lambda a: tc.linalg.matrix_norm(a, "fro", (1, 0)), [arr((3, 2), F32)],
           lambda a: np.linalg.norm(a), F32, "fro over (1, 0), float32", rtol=1e-5, atol=1e-5)
    sample("norm", tc.norm, [x], lambda a: norm(a.ravel()), F64, "tc.norm(x)")
    sample("norm", lambda a: a.norm(1, 0, keepdim=True), [x], lambda a: norm(a, 1, 0, True), F64, "x.norm(1, 0)")
    sample("norm.str", lambda a: tc.norm(a, "fro"), [x], lambda a: norm(a), F64, "p='fro'")
    sample("norm.str", lambda a: a.norm("fro", [1]), [x], lambda a: norm(a, 2, 1), F64, "x.norm('fro', [1])")

    def cosine(a, b, dim=1, eps=1e-8):
        a, b = np.broadcast_arrays(a, b)
        na = np.maximum(np.sqrt((a * a).sum(dim, keepdims=True)), eps)
        nb = np.maximum(np.sqrt((b * b).sum(dim, keepdims=True)), eps)
        return ((a / na) * (b / nb)).sum(dim)
    sample("cosine_similarity", tc.cosine_similarity, [arr((3, 4), F64), arr((3, 4), F64)], cosine, F64,
           "tc.cosine_similarity(a, b)")
    sample("cosine_similarity", lambda a, b: tc.cosine_similarity(a, b, 0, eps=0.5), [arr((3, 1), F64), arr((3, 2), F64)],
           lambda a, b: cosine(a, b, 0, 0.5), F64, "broadcast, dim 0, eps")
    sample("pairwise_distance", tc.pairwise_distance, [arr((3, 4), F64), arr((3, 4), F64)],
           lambda a, b: norm(a - b + 1e-6, 2, -1), F64, "tc.pairwise_distance(a, b)")
    sample("pairwise_distance", lambda a, b: tc.pairwise_distance(a, b, 1.0, keepdim=True), [arr((4,), F64), arr((2, 4), F64)],
           lambda a, b: norm(a - b + 1e-6, 1, -1, True), F64, "p=1, broadcast, keepdim")

    def cdist(a, b, p=2.0):
        return norm(a[..., :, None, :] - b[..., None, :, :], p, -1)
    sample("cdist", tc.cdist, [arr((4, 3), F64), arr((5, 3), F64)], cdist, F64, "tc.cdist(x1, x2)")
    sample("cdist", lambda a, b: tc.cdist(a, b, 1.0), [arr((2, 3, 2), F64), arr((1, 4, 2), F64)],
           lambda a, b: cdist(a, b, 1.0), F64, "p=1, broadcast batch")
    sample("cdist", lambda a, b: tc.cdist(a, b, float("inf")), [arr((3, 2), F32), arr((2, 2), F32)],
           lambda a, b: cdist(a, b, np.inf), F32, "p=inf, float32", rtol=1e-5, atol=1e-5)
    sample("tensordot.int", tc.tensordot, [arr((2, 3, 4), F64), arr((3, 4, 5), F64)], np.tensordot, F64,
           "tc.tensordot(a, b): dims=2")
    sample("tensordot.int", lambda a, b: tc.tensordot(a, b, 0), [arr((2,), F64), arr((3,), F64)],
           lambda a, b: np.tensordot(a, b, 0), F64, "dims=0: the outer product")
    sample("tensordot", lambda a, b: tc.tensordot(a, b, [1, 0], [0, 2]), [arr((4, 3, 2), F64), arr((3, 5, 4), F64)],
           lambda a, b: np.tensordot(a, b, ([1, 0], [0, 2])), F64, "dims ([1, 0], [0, 2])")
    sample("tensordot", lambda a, b: tc.tensordot(a, b, [0], [1]), [arr((1, 3), I64, -3, 3), arr((2, 4), I64, -3, 3)],
           lambda a, b: np.tensordot(a, b.sum(1, keepdims=True), ([0], [1])), I64, "a size-1 dim against 4, int64")
    for eq, shapes in (("ij,jk->ik", [(3, 4), (4, 5)]), ("ii->i", [(3, 3)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                       ("...ij,...jk", [(2, 3, 4), (4, 5)]), ("ij,kj->", [(2, 3), (4, 3)]),
                       ("abc,cd,de->ae", [(2, 3, 4), (4, 5), (5, 6)]), ("iij->j", [(3, 3, 2)]),
                       ("ij,ij->ij", [(2, 3), (1, 3)]), ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
                       ("...ik,...j->ij", [(1, 2, 3), (3,)])):
        sample("einsum", lambda *t, e=eq: tc.einsum(e, *t), [arr(sh, F64) for sh in shapes],
               lambda *t, e=eq: np.einsum(e.replace("...ik,...j->ij", "aik,j->ij") if "...ik" in e else e, *t),
               F64, f"'{eq}'")
    sample("einsum", lambda a, b: tc.einsum("i,i", [a, b]), [arr((3,), I64), arr((3,), I64)],
           lambda a, b: np.einsum("i,i", a, b), I64, "operands as a list, int64")
    sample("broadcast_tensors", tc.broadcast_tensors, [arr((3, 1), F64), arr((4,), F64)],
           lambda a, b: tuple(np.broadcast_arrays(a, b)), (F64, F64), "(3, 1) and (4,)")


_norm_samples()


def _np_scatter(x, dim, index, src, combine):
    out = np.array(x, copy=True)
    where = list(np.indices(index.shape, sparse=True))
    where[dim] = index
    combine(out, tuple(where), src[tuple(slice(0, n) for n in index.shape)])
    return out


def _np_assign(out, where, values):
    out[where] = values


def _scatter_samples():
    x, idx = arr((3, 5), F64), np.array([[0, 1, 2, 0, 1], [2, 2, 1, 0, 0]], np.int64)
    src = arr((2, 5), F64)
    src_zeros = src.copy()
    src_zeros[0, 3] = src_zeros[1, 4] = 0.0
    distinct_idx = np.array([[0, 1, 2, 1, 2], [2, 0, 1, 0, 1]], np.int64)
    sample("scatter.src", lambda a, i, b: tc.scatter(a, 0, i, b), [x, distinct_idx, src],
           lambda a, i, b: _np_scatter(a, 0, i, b, _np_assign), F64, "tc.scatter(x, 0, index, src)")
    sample("scatter.src", lambda a, i, b: a.scatter(1, i, b), [x, distinct_idx[:, :3], arr((3, 4), F64)],
           lambda a, i, b: _np_scatter(a, 1, i, b, _np_assign), F64, "x.scatter(1, ...), src larger than index")
    sample("scatter.value", lambda a, i: a.scatter(1, i, 7.5), [x, idx[:, :2]],
           lambda a, i: _np_scatter(a, 1, i, np.full(i.shape, 7.5), _np_assign), F64, "x.scatter(1, index, 7.5)")
    sample("scatter.reduce", lambda a, i, b: a.scatter(0, i, b, reduce="multiply"), [x, idx, src],
           lambda a, i, b: _np_scatter(a, 0, i, b, np.multiply.at), F64, "x.scatter(0, index, src, reduce='multiply')")
    sample("scatter.value_reduce", lambda a, i: a.scatter(0, i, 2.0, reduce="add"), [x, idx],
           lambda a, i: _np_scatter(a, 0, i, np.full(i.shape, 2.0), np.add.at), F64, "x.scatter(0, index, 2.0, reduce='add')")
    for name, ufunc in (("scatter_prod", np.multiply.at), ("scatter_amax", np.maximum.at), ("scatter_amin", np.minimum.at)):
        sample(name, lambda a, i, b, n=name: getattr(tc, n)(a, 0, i, b), [x, idx, src],
               lambda a, i, b, u=ufunc: _np_scatter(a, 0, i, b, u), F64, f"tc.{name}")
        sample(name, lambda a, i, b, n=name: getattr(tc, n)(a, 1, i, b), [arr((2, 4), I64), idx[:, :3] % 4, arr((2, 3), I64)],
               lambda a, i, b, u=ufunc: _np_scatter(a, 1, i, b, u), I64, "int64")
    sample("scatter_prod", lambda a, i, b: tc.scatter_prod(a, 0, i, b), [x, idx, src_zeros],
           lambda a, i, b: _np_scatter(a, 0, i, b, np.multiply.at), F64, "zeros in src")
    for mode, ufunc in (("sum", np.add.at), ("prod", np.multiply.at), ("amax", np.maximum.at), ("amin", np.minimum.at)):
        sample("scatter_reduce.two", lambda a, i, b, m=mode: tc.scatter_reduce(a, 0, i, b, m), [x, idx, src],
               lambda a, i, b, u=ufunc: _np_scatter(a, 0, i, b, u), F64, f"reduce='{mode}'")

    def mean_ref(a, i, b, include_self):
        total = _np_scatter(a if include_self else np.where(_hits(a, i), 0, a), 0, i, b, np.add.at)
        n = _np_scatter(np.ones_like(a) if include_self else np.zeros_like(a), 0, i, np.ones_like(b), np.add.at)
        return np.where(n > 0, total / np.maximum(n, 1), a)

    def _hits(a, i):
        return _np_scatter(np.zeros(a.shape), 0, i, np.ones(i.shape), np.add.at) > 0
    sample("scatter_reduce.two", lambda a, i, b: a.scatter_reduce(0, i, b, "mean"), [x, idx, src],
           lambda a, i, b: mean_ref(a, i, b, True), F64, "x.scatter_reduce(0, index, src, 'mean')")
    sample("scatter_reduce.two", lambda a, i, b: tc.scatter_reduce(a, 0, i, b, "mean", include_self=False),
           [x, idx, src], lambda a, i, b: mean_ref(a, i, b, False), F64, "mean, include_self=False")
    sample("scatter_reduce.two", lambda a, i, b: tc.scatter_reduce(a, 0, i, b, "amax", include_self=False),
           [x, idx, src], lambda a, i, b: np.where(_hits(a, i), _np_scatter(np.full(a.shape, -np.inf), 0, i, b, np.maximum.at), a),
           F64, "amax, include_self=False")
    sample("index_copy", lambda a, i, b: tc.index_copy(a, 1, i, b), [x, np.array([4, 0], np.int64), arr((3, 2), F64)],
           lambda a, i, b: _np_scatter(a, 1, np.broadcast_to(i, b.shape), b, _np_assign), F64, "tc.index_copy(x, 1, ...)")
    sample("index_copy", lambda a, i, b: a.index_copy(0, i, b), [arr((4,), F32), np.array([3, 1], np.int64), arr((2,), F32)],
           lambda a, i, b: _np_scatter(a, 0, i, b, _np_assign), F32, "x.index_copy(0, ...), 1-D")
    rows, cols = np.array([2, 0], np.int64), np.array([[1], [4]], np.int64)

    def put_ref(a, i, j, v, add):
        out = np.array(a, copy=True)
        (np.add.at if add else _np_assign)(out, (i, j), np.broadcast_to(v, np.broadcast_shapes(i.shape, j.shape)))
        return out
    sample("index_put", lambda a, i, j, v: tc.index_put(a, [i, j], v), [x, rows, cols, arr((2, 2), F64)],
           lambda a, i, j, v: put_ref(a, i, j, v, False), F64, "tc.index_put(x, [rows, cols], v)")
    sample("index_put", lambda a, i, v: a.index_put((None, i), v, accumulate=True),
           [x, np.array([4, 1, 4], np.int64), arr((3,), F64)],
           lambda a, i, v: put_ref(a, np.arange(3)[:, None], i, v, True), F64,
           "x.index_put((None, index), v, accumulate=True), index repeats")

    def diag_ref(a, b, offset, d1, d2):
        out = np.array(a, copy=True)
        view = np.diagonal(out, offset, d1, d2)
        view.setflags(write=True)
        view[...] = b
        return out
    sample("diagonal_scatter", lambda a, b: tc.diagonal_scatter(a, b, 1, 0, 1), [arr((3, 4, 5), F64), arr((5, 3), F64)],
           lambda a, b: diag_ref(a, b, 1, 0, 1), F64, "offset 1, dims (0, 1)")
    sample("diagonal_scatter", lambda a, b: a.diagonal_scatter(b, -1, 2, 0), [arr((3, 2, 4), F64), arr((2, 3), F64)],
           lambda a, b: diag_ref(a, b, -1, 2, 0), F64, "x.diagonal_scatter(src, -1, 2, 0)")


_scatter_samples()


def _special_samples():
    for n in (1, 2, 3):
        sample("polygamma", lambda x, n=n: tc.polygamma(n, x), [arr((2, 5), F64, -4.0, 6.0)],
               lambda x, n=n: _vec(lambda v: _polygamma1(n, v))(x), F64, f"tc.polygamma({n}, x)")
    sample("polygamma", lambda x: tc.polygamma(0, x), [arr((4,), F32)], lambda x: _vec(lambda v: _polygamma1(0, v))(x),
           F32, "n = 0 is digamma, float32")
    sample("erfc", tc.erfc, [np.array([5.0, 10.0, 26.0, 27.5, 30.0, -30.0], F64)], _vec(math.erfc), F64,
           "the far tail, subnormals and 2")
    sample("erfinv", tc.erfinv, [np.array([0.999999, -0.9999999999999, 1e-300, 0.5], F64)], _vec(_erfinv1), F64,
           "near +-1 and near 0")


_special_samples()


def _data_dependent_samples():
    x = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]], F32)
    eager_only("nonzero", tc.nonzero, [x], lambda a: np.argwhere(a), I64, "tc.nonzero(x)")
    eager_only("nonzero", lambda a: a.nonzero(), [np.zeros((2, 2), F64)], lambda a: np.zeros((0, 2), np.int64), I64,
               "x.nonzero(), none")
    eager_only("argwhere", tc.argwhere, [arr((3,), I32, -1, 2)], lambda a: np.argwhere(a), I64, "tc.argwhere(x)")
    eager_only("argwhere", lambda a: a.argwhere(), [x], lambda a: np.argwhere(a), I64, "x.argwhere()")
    eager_only("masked_select", tc.masked_select, [arr((2, 3), F64), np.array([True, False, True])],
               lambda a, m: np.broadcast_to(a, (2, 3))[np.broadcast_to(m, (2, 3))], F64, "tc.masked_select(x, mask)")
    eager_only("masked_select", lambda a, m: a.masked_select(m), [arr((3,), F32), np.array([[True], [False]])],
               lambda a, m: np.broadcast_to(a, (2, 3))[np.broadcast_to(m, (2, 3))], F32, "x.masked_select(m), broadcast")
    ints = np.array([3, 1, 3, 2, 1, 3], I64)
    eager_only("unique", tc.unique, [ints], np.unique, I64, "tc.unique(x)")
    eager_only("unique", lambda a: a.unique(return_inverse=True, return_counts=True), [ints],
               lambda a: tuple(np.unique(a, return_inverse=True, return_counts=True)), (I64, I64, I64),
               "x.unique(return_inverse=True, return_counts=True)")
    rows = np.array([[1.0, 2.0], [0.5, 0.5], [1.0, 2.0]], F64)
    eager_only("unique", lambda a: tc.unique(a, dim=0, return_inverse=True), [rows],
               lambda a: tuple(np.unique(a, axis=0, return_inverse=True)), (F64, I64), "dim=0")
    sample("nonzero_static", lambda a: tc.nonzero_static(a, size=4), [x],
           lambda a: np.concatenate([np.argwhere(a), np.full((1, 2), -1)])[:4], I64, "tc.nonzero_static(x, size=4): padded")
    sample("nonzero_static", lambda a: a.nonzero_static(size=2, fill_value=9), [x],
           lambda a: np.argwhere(a)[:2], I64, "x.nonzero_static(size=2): cut")
    sample("nonzero_static", lambda a: tc.nonzero_static(a, size=2), [arr((5,), I64, -1, 2)],
           lambda a: np.concatenate([np.argwhere(a), np.full((2, 1), -1)])[:2], I64, "1-D")


_data_dependent_samples()
_more_loss_samples()


# ---------------------------------------------------------------- layout ops (issue 13)

def _np_diag_embed(v, k=0):
    n = v.shape[-1] + abs(k)
    out = np.zeros(v.shape[:-1] + (n, n), v.dtype)
    for i in range(v.shape[-1]):
        out[..., i + max(-k, 0), i + max(k, 0)] = v[..., i]
    return out


def _layout_samples():
    x, y = arr((3, 4), F32), arr((2, 3, 4), F64)
    sample("flip", lambda t: tc.flip(t, [0, 1]), [x], lambda t: np.flip(t, (0, 1)), F32, "tc.flip(x, [0, 1])")
    sample("flip", lambda t: t.flip([-1]), [y], lambda t: np.flip(t, -1), F64, "x.flip([-1]) f64")
    sample("flip", lambda t: tc.flip(t, []), [x], lambda t: t, F32, "no dims")
    sample("flip", lambda t: tc.flip(t, [0]), [arr((0, 3), I64)], lambda t: t, I64, "empty int64")
    sample("fliplr", tc.fliplr, [x], np.fliplr, F32, "tc.fliplr(x)")
    sample("fliplr", lambda t: t.fliplr(), [y], np.fliplr, F64, "x.fliplr() 3-D")
    sample("flipud", tc.flipud, [arr((5,), I32)], np.flipud, I32, "tc.flipud(int32)")
    sample("flipud", lambda t: t.flipud(), [x], np.flipud, F32, "x.flipud()")
    sample("roll", lambda t: tc.roll(t, 1, 1), [x], lambda t: np.roll(t, 1, 1), F32, "tc.roll(x, 1, 1)")
    sample("roll", lambda t: t.roll([1, -5], [0, 2]), [y], lambda t: np.roll(t, (1, -5), (0, 2)), F64,
           "x.roll([1, -5], [0, 2])")
    sample("roll", lambda t: tc.roll(t, 5), [x], lambda t: np.roll(t, 5), F32, "flat roll")
    for name, fn in (("movedim", tc.movedim), ("moveaxis", tc.moveaxis)):
        sample(name, lambda t, f=fn: f(t, 0, -1), [y], lambda t: np.moveaxis(t, 0, -1), F64, f"tc.{name}(x, 0, -1)")
        sample(name, lambda t, n=name: getattr(t, n)([0, 1], [2, 0]), [y], lambda t: np.moveaxis(t, [0, 1], [2, 0]),
               F64, f"x.{name}([0, 1], [2, 0])")
    for name, fn in (("swapaxes", tc.swapaxes), ("swapdims", tc.swapdims)):
        sample(name, lambda t, f=fn: f(t, 0, 2), [y], lambda t: np.swapaxes(t, 0, 2), F64, f"tc.{name}(x, 0, 2)")
        sample(name, lambda t, n=name: getattr(t, n)(-1, 0), [x], lambda t: t.T, F32, f"x.{name}(-1, 0)")
    sample("unbind", lambda t: tc.unbind(t, 1), [x], lambda t: tuple(t[:, i] for i in range(4)), (F32,) * 4,
           "tc.unbind(x, 1)")
    sample("unbind", lambda t: t.unbind(), [y], lambda t: tuple(t), (F64,) * 2, "x.unbind()")
    sample("narrow", lambda t: tc.narrow(t, 1, 1, 2), [x], lambda t: t[:, 1:3], F32, "tc.narrow(x, 1, 1, 2)")
    sample("narrow", lambda t: t.narrow(0, -2, 2), [y], lambda t: t[-2:], F64, "x.narrow(0, -2, 2)")
    sample("unflatten", lambda t: tc.unflatten(t, 1, (2, -1)), [x], lambda t: t.reshape(3, 2, 2), F32,
           "tc.unflatten(x, 1, (2, -1))")
    sample("unflatten", lambda t: t.unflatten(-1, (4, 1)), [y], lambda t: t.reshape(2, 3, 4, 1), F64,
           "x.unflatten(-1, (4, 1))")
    z = arr((4, 3), F32)
    sample("view_as", lambda t, o: t.view_as(o), [x, z], lambda t, o: t.reshape(4, 3), F32, "x.view_as(y)")
    sample("reshape_as", lambda t, o: t.reshape_as(o), [x, z], lambda t, o: t.reshape(4, 3), F32, "x.reshape_as(y)")
    sample("expand_as", lambda t, o: t.expand_as(o), [arr((3, 1), F64), arr((2, 3, 5), F64)],
           lambda t, o: np.broadcast_to(t, o.shape), F64, "x.expand_as(y)")
    for name, fn in (("atleast_1d", np.atleast_1d), ("atleast_2d", np.atleast_2d), ("atleast_3d", np.atleast_3d)):
        for t in (np.array(1.5, F32), arr((3,), F64), arr((2, 3), F32), arr((2, 1, 2), I64)):
            sample(name, getattr(tc, name), [t], fn, str(t.dtype), f"tc.{name}({t.ndim}-D)")
    a1, b1, a2, b2 = arr((3,), F32), arr((2,), F32), arr((2, 3), F64), arr((2, 1), F64)
    sample("hstack", lambda p, q: tc.hstack([p, q]), [a1, b1], lambda p, q: np.hstack([p, q]), F32, "1-D")
    sample("hstack", lambda p, q: tc.hstack([p, q]), [a2, b2], lambda p, q: np.hstack([p, q]), F64, "2-D")
    sample("vstack", lambda p, q: tc.vstack([p, q]), [a1, arr((3,), F32)], lambda p, q: np.vstack([p, q]), F32, "1-D")
    sample("vstack", lambda p, q: tc.vstack([p, q]), [a2, arr((1, 3), F64)], lambda p, q: np.vstack([p, q]), F64, "2-D")
    sample("dstack", lambda p, q: tc.dstack([p, q]), [a2, a2], lambda p, q: np.dstack([p, q]), F64, "2-D")
    sample("dstack", lambda p, q: tc.dstack([p, q]), [a1, a1], lambda p, q: np.dstack([p, q]), F32, "1-D")
    sample("column_stack", lambda p, q: tc.column_stack([p, q]), [a1, arr((3,), F32)],
           lambda p, q: np.column_stack([p, q]), F32, "1-D")
    sample("column_stack", lambda p, q: tc.column_stack([p, q]), [arr((3, 2), F64), arr((3,), F64)],
           lambda p, q: np.column_stack([p, q]), F64, "2-D and 1-D")
    sample("split_with_sizes", lambda t: tc.split_with_sizes(t, [1, 3], 1), [x],
           lambda t: (t[:, :1], t[:, 1:]), (F32, F32), "tc.split_with_sizes(x, [1, 3], 1)")
    sample("split_with_sizes", lambda t: t.split_with_sizes([2, 0]), [arr((2, 2), F64)],
           lambda t: (t, t[:0]), (F64, F64), "x.split_with_sizes([2, 0])")
    sample("tensor_split", lambda t: tc.tensor_split(t, 3, 1), [x], lambda t: tuple(np.array_split(t, 3, 1)),
           (F32,) * 3, "tc.tensor_split(x, 3, 1)")
    sample("tensor_split", lambda t: t.tensor_split(4), [arr((2, 2), F64)], lambda t: tuple(np.array_split(t, 4)),
           (F64,) * 4, "x.tensor_split(4) more parts than rows")
    sample("tensor_split.indices", lambda t: tc.tensor_split(t, [1, 3], 1), [x],
           lambda t: (t[:, :1], t[:, 1:3], t[:, 3:]), (F32,) * 3, "tc.tensor_split(x, [1, 3], 1)")
    sample("tensor_split.indices", lambda t: t.tensor_split([3, 1]), [arr((4,), F64)],
           lambda t: (t[:3], t[3:1], t[1:]), (F64,) * 3, "x.tensor_split([3, 1]) overlapping")
    sample("narrow.Tensor", lambda t, s: tc.narrow(t, 1, s, 2), [x, np.array(-3)], lambda t, s: t[:, 1:3], F32,
           "tc.narrow(x, 1, tensor(-3), 2)")
    sample("narrow.Tensor", lambda t, s: t.narrow(0, s, 1), [y, np.array(1, I32)], lambda t, s: t[1:2], F64,
           "x.narrow(0, tensor(1), 1)")
    for name, fn in (("atleast_1d.Sequence", np.atleast_1d), ("atleast_2d.Sequence", np.atleast_2d),
                     ("atleast_3d.Sequence", np.atleast_3d)):
        sample(name, lambda p, q, n=name: getattr(tc, n.split(".")[0])([p, q]), [np.array(2.0, F32), arr((3,), F32)],
               lambda p, q, f=fn: tuple(f(p, q)), (F32, F32), "a list")
    eager_only("tensor_split.tensor_indices_or_sections", lambda t, p: tc.tensor_split(t, p, 1),
               [x, np.array([1, 3])], lambda t, p: (t[:, :1], t[:, 1:3], t[:, 3:]), (F32,) * 3,
               "tc.tensor_split(x, tensor([1, 3]), 1)")
    eager_only("tensor_split.tensor_indices_or_sections", lambda t, p: t.tensor_split(p), [y, np.array(2)],
               lambda t, p: (t[:1], t[1:]), (F64, F64), "x.tensor_split(tensor(2))")
    sample("repeat", lambda t: t.repeat(2, 1, 2), [x], lambda t: np.tile(t, (2, 1, 2)), F32, "x.repeat(2, 1, 2)")
    sample("repeat", lambda t: t.repeat((3,)), [arr((2,), I32)], lambda t: np.tile(t, 3), I32, "int32")
    sample("tile", lambda t: tc.tile(t, (2,)), [x], lambda t: np.tile(t, (1, 2)), F32, "tc.tile(x, (2,))")
    sample("tile", lambda t: t.tile((2, 1, 1)), [arr((2, 3), F64)], lambda t: np.tile(t, (2, 1, 1)), F64,
           "x.tile((2, 1, 1))")
    for name, fn in (("tril", np.tril), ("triu", np.triu)):
        sample(name, getattr(tc, name), [x], fn, F32, f"tc.{name}(x)")
        sample(name, lambda t, n=name: getattr(t, n)(-1), [y], lambda t, f=fn: f(t, -1), F64, f"x.{name}(-1) 3-D")
        sample(name, lambda t, n=name: getattr(tc, n)(t, 2), [arr((4, 3), B)], lambda t, f=fn: f(t, 2), B, "bool k=2")
    sample("diagonal", tc.diagonal, [x], np.diagonal, F32, "tc.diagonal(x)")
    sample("diagonal", lambda t: t.diagonal(-1, 2, 0), [y], lambda t: np.diagonal(t, -1, 2, 0), F64,
           "x.diagonal(-1, 2, 0)")
    sample("diagonal", lambda t: tc.diagonal(t, 5), [x], lambda t: np.diagonal(t, 5), F32, "offset past the end")
    sample("diag_embed", tc.diag_embed, [arr((2, 3), F32)], _np_diag_embed, F32, "tc.diag_embed(x)")
    sample("diag_embed", lambda t: t.diag_embed(-1), [arr((3,), F64)], lambda t: _np_diag_embed(t, -1), F64,
           "x.diag_embed(-1)")
    sample("diag_embed", lambda t: tc.diag_embed(t, 1, 0, 2), [arr((2, 3), F64)],
           lambda t: np.moveaxis(_np_diag_embed(t, 1), (-2, -1), (0, 2)), F64, "dims 0 and 2")
    sample("diag", tc.diag, [arr((3,), F32)], np.diag, F32, "tc.diag(vector)")
    sample("diag", lambda t: t.diag(1), [x], lambda t: np.diag(t, 1), F32, "x.diag(1) matrix")
    sample("diag", lambda t: tc.diag(t, -2), [arr((3,), I64)], lambda t: np.diag(t, -2), I64, "int64 k=-2")

    m = arr((3, 4), B)
    sample("masked_fill", lambda t, k: tc.masked_fill(t, k, 2.5), [x, m], lambda t, k: np.where(k, 2.5, t), F32,
           "tc.masked_fill(x, mask, 2.5)")
    sample("masked_fill", lambda t, k: t.masked_fill(k, -1), [arr((3, 4), I32), arr((4,), B)],
           lambda t, k: np.where(k, -1, t), I32, "x.masked_fill(mask, -1) broadcast int32")
    sample("masked_fill", lambda t, k, v: tc.masked_fill(t, k, v), [arr((2, 3), F64), arr((2, 3), B), np.array(7.0)],
           lambda t, k, v: np.where(k, v, t), F64, "0-d tensor value")
    idx = np.array([[0, 3], [2, 2], [1, 0]])
    sample("take", tc.take, [x, np.array([[0, -1], [5, 11]])], lambda t, i: t.reshape(-1)[i], F32,
           "tc.take(x, idx) negative index")
    sample("take", lambda t, i: t.take(i), [arr((2, 3), I64), np.array(4)], lambda t, i: t.reshape(-1)[i], I64,
           "x.take(0-d index)")
    def _index_fill(t, d, i, v):
        out = t.copy()
        ix = [slice(None)] * t.ndim
        ix[d] = i
        out[tuple(ix)] = v
        return out
    sample("index_fill.int_Scalar", lambda t, i: tc.index_fill(t, 1, i, -1.5), [x, np.array([0, -1])],
           lambda t, i: _index_fill(t, 1, i, -1.5), F32, "tc.index_fill(x, 1, idx, -1.5)")
    sample("index_fill.int_Scalar", lambda t, i: t.index_fill(0, i, 7), [arr((3, 2), I32), np.array([2, 2])],
           lambda t, i: _index_fill(t, 0, i, 7), I32, "x.index_fill(0, idx, 7) repeated index int32")
    sample("index_fill.int_Tensor", lambda t, i, v: tc.index_fill(t, 0, i, v), [y, np.array([1]), np.array(2.5)],
           lambda t, i, v: _index_fill(t, 0, i, v), F64, "tc.index_fill(x, 0, idx, tensor)")
    sample("index_fill.int_Tensor", lambda t, i, v: t.index_fill(-1, i, v), [x, np.array([3, 0]), np.array(1.0, F32)],
           lambda t, i, v: _index_fill(t, -1, i, v), F32, "x.index_fill(-1, idx, tensor)")
    sample("take_along_dim", lambda t, i: tc.take_along_dim(t, i, 1), [x, idx],
           lambda t, i: np.take_along_axis(t, i, 1), F32, "tc.take_along_dim(x, idx, 1)")
    sample("take_along_dim", lambda t, i: t.take_along_dim(i), [y, np.array([0, 23, 5])],
           lambda t, i: t.reshape(-1)[i], F64, "x.take_along_dim(idx) flat")
    sample("take_along_dim", lambda t, i: tc.take_along_dim(t, i, 0), [x, np.array([[2], [0]])],
           lambda t, i: np.take_along_axis(t, np.broadcast_to(i, (2, 4)), 0), F32, "indices broadcast")
    def _slice_scatter(t, v, d, s_, e, st):
        out = t.copy()
        ix = [slice(None)] * t.ndim
        ix[d] = slice(s_, e, st)
        out[tuple(ix)] = v
        return out
    sample("slice_scatter", lambda t, v: tc.slice_scatter(t, v, 1, 0, None, 2), [x, arr((3, 2), F32)],
           lambda t, v: _slice_scatter(t, v, 1, 0, None, 2), F32, "every other column")
    sample("slice_scatter", lambda t, v: t.slice_scatter(v, dim=1, start=-2), [y, arr((2, 2, 4), F64)],
           lambda t, v: _slice_scatter(t, v, 1, -2, None, 1), F64, "x.slice_scatter(v, dim=1, start=-2)")
    sample("select_scatter", lambda t, v: tc.select_scatter(t, v, 1, -1), [x, arr((3,), F32)],
           lambda t, v: np.concatenate([t[:, :-1], v[:, None]], 1), F32, "last column")
    sample("select_scatter", lambda t, v: t.select_scatter(v, 0, 1), [y, arr((3, 4), F64)],
           lambda t, v: np.stack([t[0], v]), F64, "x.select_scatter(v, 0, 1)")
    sample("repeat_interleave.self_int", lambda t: tc.repeat_interleave(t, 2, 1), [x],
           lambda t: np.repeat(t, 2, 1), F32, "tc.repeat_interleave(x, 2, 1)")
    sample("repeat_interleave.self_int", lambda t: t.repeat_interleave(3), [arr((2, 2), I64)],
           lambda t: np.repeat(t, 3), I64, "x.repeat_interleave(3) flattens")
    eager_only("repeat_interleave.self_Tensor", lambda t, r: tc.repeat_interleave(t, r, 0), [x, np.array([0, 2, 1])],
               lambda t, r: np.repeat(t, r, 0), F32, "tensor repeats along dim 0")
    eager_only("repeat_interleave.self_Tensor", lambda t, r: t.repeat_interleave(r), [arr((2,), F64), np.array(2)],
               lambda t, r: np.repeat(t, 2), F64, "x.repeat_interleave(tensor(2))")
    sample("meshgrid", lambda p, q: tc.meshgrid(p, q, indexing="ij"), [arr((3,), F32), arr((2,), F32)],
           lambda p, q: tuple(np.meshgrid(p, q, indexing="ij")), (F32, F32), "ij")
    sample("meshgrid", lambda p, q, r: tc.meshgrid([p, q, r], indexing="xy"), [arr((3,), F64), arr((2,), F64),
           np.array(1.5)], lambda p, q, r: tuple(np.meshgrid(p, q, r, indexing="xy")), (F64,) * 3, "xy, a list, 0-d")


_layout_samples()


# ---------------------------------------------------------------- shape and view ops

def _shape_samples():
    x = arr((2, 3, 4))
    sample("reshape", lambda x: tc.reshape(x, (4, 6)), [x], lambda x: x.reshape(4, 6), F32, "tc.reshape")
    sample("reshape", lambda x: x.reshape(-1), [x], lambda x: x.reshape(-1), F32, "x.reshape(-1)")
    sample("reshape", lambda x: x.reshape(3, -1, 2), [arr((2, 3, 2), I32)], lambda x: x.reshape(3, -1, 2),
           I32, "varargs with -1, int32")
    sample("reshape", lambda x: x.reshape(()), [np.array([True])], lambda x: x.reshape(()), B, "to 0-d bool")
    sample("reshape", lambda x: x.reshape([0, 5]), [np.zeros((5, 0), F64)], lambda x: x.reshape(0, 5), F64, "empty")
    sample("view", lambda x: x.view(6, 4), [x], lambda x: x.reshape(6, 4), F32, "x.view(6, 4)")
    sample("view", lambda x: x.view((-1,)), [arr((2, 2), I64)], lambda x: x.reshape(-1), I64, "x.view((-1,))")
    sample("view", lambda x: x.view(1, 1), [np.array(True)], lambda x: x.reshape(1, 1), B, "x.view(1, 1) 0-d bool")
    sample("flatten", tc.flatten, [x], lambda x: x.reshape(-1), F32, "tc.flatten(x)")
    sample("flatten", lambda x: x.flatten(1), [x], lambda x: x.reshape(2, 12), F32, "x.flatten(1)")
    sample("flatten", lambda x: x.flatten(0, -2), [arr((2, 3, 2), B)], lambda x: x.reshape(6, 2), B,
           "start 0, end -2, bool")
    sample("flatten", tc.flatten, [np.array(5.0, F32)], lambda x: x.reshape(1), F32, "0-d becomes (1,)")
    y = arr((1, 3, 1, 2))
    sample("squeeze", tc.squeeze, [y], np.squeeze, F32, "all size-1 dims")
    sample("squeeze", lambda x: x.squeeze(2), [y], lambda x: x.squeeze(2), F32, "x.squeeze(2)")
    sample("squeeze", lambda x: x.squeeze(1), [y], lambda x: x, F32, "non-1 dim is kept")
    sample("squeeze", lambda x: tc.squeeze(x, (0, -2)), [arr((1, 3, 1, 2), I64)],
           lambda x: x.squeeze((0, 2)), I64, "dims (0, -2)")
    sample("squeeze", lambda x: tc.squeeze(x, ()), [y], lambda x: x, F32, "dims () squeeze nothing")
    sample("unsqueeze", lambda x: tc.unsqueeze(x, 0), [arr((3,), I32)], lambda x: x[None], I32, "dim 0")
    sample("unsqueeze", lambda x: x.unsqueeze(-1), [x], lambda x: x[..., None], F32, "x.unsqueeze(-1)")
    sample("unsqueeze", lambda x: x.unsqueeze(-1), [np.array(1.0, F64)], lambda x: x.reshape(1), F64, "0-d")
    sample("permute", lambda x: tc.permute(x, (2, 0, 1)), [x], lambda x: x.transpose(2, 0, 1), F32, "tc.permute")
    sample("permute", lambda x: x.permute(-1, 0, 1), [arr((2, 3, 2), B)], lambda x: x.transpose(2, 0, 1), B,
           "x.permute(-1, 0, 1) bool")
    sample("permute", lambda x: x.permute(()), [np.array(3, I32)], lambda x: x, I32, "x.permute(()) 0-d")
    sample("transpose", lambda x: tc.transpose(x, 0, -1), [np.array(2.5, F64)], lambda x: x, F64, "0-d")
    sample("transpose", lambda x: tc.transpose(x, 0, 2), [x], lambda x: x.swapaxes(0, 2), F32, "tc.transpose")
    sample("transpose", lambda x: x.transpose(-1, -2), [arr((2, 3), I64)], lambda x: x.T, I64, "x.transpose(-1, -2)")
    sample("t", tc.t, [arr((2, 3))], lambda x: x.T, F32, "tc.t 2-D")
    sample("t", lambda x: x.t(), [arr((3,), I32)], lambda x: x, I32, "x.t() 1-D")
    sample("t", lambda x: x.t(), [np.array(2.0, F64)], lambda x: x, F64, "0-d")
    sample("t", lambda x: x.t(), [arr((1, 4), B)], lambda x: x.T, B, "x.t() bool (1, 4)")
    sample("numpy_T", lambda x: x.T, [arr((2, 3))], lambda x: x.T, F32, "x.T 2-D")
    sample("numpy_T", lambda x: x.T, [x], lambda x: x.transpose(2, 1, 0), F32, "x.T 3-D reverses dims")
    sample("numpy_T", lambda x: x.T, [np.array(1, I32)], lambda x: x, I32, "x.T 0-d")
    sample("mT", lambda x: x.mT, [arr((3, 2), I64)], lambda x: x.T, I64, "x.mT 2-D")
    sample("mT", lambda x: x.mT, [x], lambda x: x.swapaxes(-1, -2), F32, "x.mT 3-D swaps the last two")
    sample("mT", lambda x: x.mT, [arr((2, 1, 2, 3), B)], lambda x: x.swapaxes(-1, -2), B, "x.mT 4-D bool")
    sample("expand", lambda x: x.expand(3, 4), [arr((3, 1))], lambda x: np.broadcast_to(x, (3, 4)), F32,
           "x.expand(3, 4)")
    sample("expand", lambda x: x.expand((2, -1, 3)), [arr((4, 1), I32)],
           lambda x: np.broadcast_to(x, (2, 4, 3)), I32, "new dim and -1")
    sample("expand", lambda x: x.expand(2, 2), [np.array(True)], lambda x: np.broadcast_to(x, (2, 2)), B,
           "0-d bool")
    sample("broadcast_to", lambda x: tc.broadcast_to(x, [2]), [np.array(1.5, F64)],
           lambda x: np.broadcast_to(x, (2,)), F64, "0-d to (2,)")
    sample("broadcast_to", lambda x: tc.broadcast_to(x, (2, 3)), [arr((3,))],
           lambda x: np.broadcast_to(x, (2, 3)), F32, "tc.broadcast_to")
    sample("broadcast_to", lambda x: x.broadcast_to((2, 1, 3)), [arr((1, 3), I64)],
           lambda x: np.broadcast_to(x, (2, 1, 3)), I64, "x.broadcast_to((2, 1, 3))")

    a, b = arr((2, 3)), arr((1, 3))
    sample("cat", lambda a, b: tc.cat([a, b]), [a, b], lambda a, b: np.concatenate([a, b]), F32, "dim 0")
    sample("cat", lambda a, b: tc.cat((a, a, b), dim=-2), [a, b],
           lambda a, b: np.concatenate([a, a, b], -2), F32, "tuple, dim -2")
    sample("cat", lambda a, b: tc.cat([a, b], 1), [arr((2, 2), I32), arr((2, 3), F64)],
           lambda a, b: np.concatenate([a, b], 1), F64, "int32 with float64 promotes")
    sample("cat", lambda a, b: tc.cat([a, b]), [arr((2,), B), arr((3,), I64)],
           lambda a, b: np.concatenate([a.astype(np.int64), b]), I64, "bool with int64")
    sample("cat", lambda a: tc.cat([a]), [arr((3,), F64)], lambda a: a, F64, "one tensor")
    sample("stack", lambda a, b: tc.stack([a, b]), [a, arr((2, 3))], lambda a, b: np.stack([a, b]), F32, "dim 0")
    sample("stack", lambda a, b: tc.stack((a, b), dim=-1), [arr((3,), I32), arr((3,), I32)],
           lambda a, b: np.stack([a, b], -1), I32, "dim -1")
    sample("stack", lambda a, b: tc.stack([a, b], 1), [arr((2, 2), F32), arr((2, 2), F64)],
           lambda a, b: np.stack([a, b], 1), F64, "mixed dtypes")

    x = arr((5, 2))
    sample("split", lambda x: tc.split(x, 2), [x], lambda x: tuple(np.split(x, [2, 4])), (F32,) * 3, "size 2")
    sample("split", lambda x: x.split(1, dim=1), [x], lambda x: tuple(np.split(x, [1], 1)), (F32,) * 2, "x.split(1, dim=1)")
    sample("split", lambda x: x.split(10), [arr((3,), I64)], lambda x: (x,), (I64,), "larger than the dim")
    sample("split", lambda x: tc.split(x, 2, -1)[1], [arr((2, 4), B)], lambda x: x[:, 2:], B, "one piece")
    sample("split.sizes", lambda x: tc.split(x, [1, 4]), [x], lambda x: tuple(np.split(x, [1])), (F32,) * 2,
           "[1, 4]")
    sample("split.sizes", lambda x: x.split((2, 0, 3), dim=0), [arr((5,), I32)],
           lambda x: tuple(np.split(x, [2, 2])), (I32,) * 3, "x.split((2, 0, 3)) empty piece")
    sample("split.sizes", lambda x: x.split([1, 1], -1), [x], lambda x: tuple(np.split(x, [1], -1)),
           (F32,) * 2, "dim -1")
    sample("chunk", lambda x: tc.chunk(x, 2), [x], lambda x: tuple(np.split(x, [3])), (F32,) * 2, "2 chunks of 5")
    sample("chunk", lambda x: x.chunk(3, dim=1), [arr((2, 6), I64)], lambda x: tuple(np.split(x, [2, 4], 1)),
           (I64,) * 3, "x.chunk(3, dim=1)")
    sample("chunk", lambda x: x.chunk(4), [arr((3,), F64)], lambda x: tuple(np.split(x, [1, 2])),
           (F64,) * 3, "more chunks than elements")


_shape_samples()


# ---------------------------------------------------------------- indexing

def _index_samples():
    x = arr((3, 4, 5))
    sample("select", lambda x: tc.select(x, 1, 2), [x], lambda x: x[:, 2], F32, "tc.select(x, 1, 2)")
    sample("select", lambda x: x.select(-1, -1), [x], lambda x: x[..., -1], F32, "x.select(-1, -1)")
    sample("select", lambda x: x.select(0, 1), [arr((3,), I32)], lambda x: x[1], I32, "1-D to 0-d")
    sample("slice", lambda x: tc.slice(x, 1, 1, 3), [x], lambda x: x[:, 1:3], F32, "tc.slice(x, 1, 1, 3)")
    sample("slice", lambda x: tc.slice(x, 2, None, None, 2), [x], lambda x: x[:, :, ::2], F32, "step 2")
    sample("slice", lambda x: tc.slice(x, 0, -2, 100), [arr((4, 2), I64)], lambda x: x[-2:100], I64,
           "negative start, end past the size")
    sample("slice", lambda x: tc.slice(x, end=0), [arr((3,), B)], lambda x: x[:0], B, "empty")
    for idx, desc in ((1, "x[1]"), (-1, "x[-1]"), ((0, -2), "x[0, -2]"), ((1, 2, 3), "x[1, 2, 3]"),
                      ((Ellipsis, 0), "x[..., 0]"), ((slice(None), 1), "x[:, 1]"),
                      ((None, 0), "x[None, 0]"), ((0, Ellipsis, None, 1), "x[0, ..., None, 1]")):
        sample("select", lambda x, i=idx: x[i], [x], lambda x, i=idx: x[i], F32, desc)
    for idx, desc in ((slice(1, None), "x[1:]"), (slice(None, None, 2), "x[::2]"),
                      (slice(-2, None), "x[-2:]"), ((slice(None), slice(1, 4, 2)), "x[:, 1:4:2]"),
                      ((Ellipsis, slice(None, -1, 3)), "x[..., :-1:3]"), (slice(5, 10), "x[5:10] empty"),
                      ((1, slice(None), slice(0, 5, 4)), "x[1, :, 0:5:4]")):
        sample("slice", lambda x, i=idx: x[i], [x], lambda x, i=idx: x[i], F32, desc)
    for idx, desc in ((None, "x[None]"), ((Ellipsis, None), "x[..., None]"),
                      ((slice(None), None, slice(None)), "x[:, None, :]"), (Ellipsis, "x[...]")):
        sample("unsqueeze", lambda x, i=idx: x[i], [arr((2, 3), I64)], lambda x, i=idx: x[i], I64, desc)
    sample("unsqueeze", lambda x: x[None, None], [np.array(1.5, F32)], lambda x: x[None, None], F32, "0-d x[None, None]")

    idx = np.array([2, 0, 2], np.int64)
    sample("index_select", lambda x, i: tc.index_select(x, 1, i), [x, idx], lambda x, i: x[:, i], F32,
           "tc.index_select dim 1")
    sample("index_select", lambda x, i: x.index_select(0, i), [arr((4, 2), I64), np.array([3, 1, 0, 3], np.int32)],
           lambda x, i: x[i], I64, "x.index_select(0, i) int32 index")
    sample("index_select", lambda x, i: x.index_select(-1, i), [arr((5,), B), np.array(4, np.int64)],
           lambda x, i: x[[int(i)]], B, "0-d index")
    sample("index_select", lambda x, i: x.index_select(0, i), [arr((3,)), np.zeros((0,), np.int64)],
           lambda x, i: x[i], F32, "empty index")
    g = np.array([[0, 1, 0], [2, 2, 1]], np.int64)
    sample("gather", lambda x, i: tc.gather(x, 1, i), [arr((2, 3)), g],
           lambda x, i: np.take_along_axis(x, i, 1), F32, "tc.gather dim 1")
    sample("gather", lambda x, i: x.gather(0, i), [arr((3, 3), I32), g.astype(np.int32)],
           lambda x, i: np.take_along_axis(x, i, 0), I32, "x.gather(0, i) int32 index")
    sample("gather", lambda x, i: x.gather(1, i), [arr((3, 4), F64), np.array([[3], [0]], np.int64)],
           lambda x, i: np.take_along_axis(x[:2], i, 1), F64, "index smaller than self")
    sample("gather", lambda x, i: tc.gather(x, 0, i), [np.array(2.5, F32), np.array([0, 0], np.int64)],
           lambda x, i: np.full(2, x), F32, "0-d self, 1-d index")
    sample("gather", lambda x, i: tc.gather(x, 0, i), [arr((5,)), np.zeros((2, 0), np.int64)],
           lambda x, i: np.zeros((2, 0), x.dtype), F32, "empty index of more dims")


    def scatter_add_ref(x, d, i, src):
        out = x.copy()
        where = list(np.indices(i.shape, sparse=True))
        where[d] = i
        np.add.at(out, tuple(where), src[tuple(slice(0, n) for n in i.shape)])
        return out
    sample("scatter_add", lambda x, i, s: tc.scatter_add(x, 1, i, s), [arr((2, 3)), g, arr((2, 3))],
           lambda x, i, s: scatter_add_ref(x, 1, i, s), F32, "tc.scatter_add dim 1, repeated index")
    sample("scatter_add", lambda x, i, s: x.scatter_add(0, i, s), [arr((3, 4), F64), g, arr((3, 3), F64)],
           lambda x, i, s: scatter_add_ref(x, 0, i, s), F64, "x.scatter_add(0, i, src) src larger than index")
    sample("scatter_add", lambda x, i, s: x.scatter_add(-1, i, s), [arr((2, 2), I32), g[:, :2].astype(np.int32) % 2,
           arr((2, 2), I32)], lambda x, i, s: scatter_add_ref(x, 1, i, s), I32, "int32, dim -1")
    sample("scatter_add", lambda x, i, s: tc.scatter_add(x, 0, i, s), [np.array(1.5, F64), np.array(0, np.int64),
           np.array(2.0, F64)], lambda x, i, s: x + s, F64, "0-d")
    sample("scatter_add", lambda x, i, s: tc.scatter_add(x, 0, i, s), [arr((5,)), np.zeros((2, 0), np.int64),
           arr((2, 0))], lambda x, i, s: x, F32, "empty index of more dims adds nothing")

    def index_add_ref(x, d, i, src, alpha=1):
        out = x.copy()
        i = np.asarray(i).reshape(-1)
        np.add.at(out, (slice(None),) * d + (i,), alpha * src.reshape(x.shape[:d] + (i.size,) + x.shape[d + 1:]))
        return out
    sample("index_add", lambda x, i, s: tc.index_add(x, 1, i, s), [arr((3, 4)), idx, arr((3, 3))],
           lambda x, i, s: index_add_ref(x, 1, i, s), F32, "tc.index_add dim 1, repeated index")
    sample("index_add", lambda x, i, s: x.index_add(0, i, s, alpha=2), [arr((4, 2), F64),
           np.array([3, 1, 3], np.int32), arr((3, 2), F64)], lambda x, i, s: index_add_ref(x, 0, i, s, 2), F64,
           "x.index_add(0, i, s, alpha=2) int32 index")
    sample("index_add", lambda x, i, s: x.index_add(-1, i, s), [arr((5,), I64), np.array(4, np.int64),
           np.array([7], np.int64)], lambda x, i, s: index_add_ref(x, 0, i, s), I64, "0-d index, int64")
    sample("index_add", lambda x, i, s: tc.index_add(x, 0, i, s), [arr((3,)), np.array([1], np.int64),
           np.array(2.0, F32)], lambda x, i, s: index_add_ref(x, 0, i, s), F32, "0-d source")
    sample("index_add", lambda x, i, s: tc.index_add(x, 0, i, s), [arr((3, 2)), np.zeros((0,), np.int64),
           np.zeros((0, 2), F32)], lambda x, i, s: x, F32, "empty index")

    def select_backward_ref(g, sizes, d, i):
        out = np.zeros(sizes, g.dtype)
        out[(slice(None),) * d + (i,)] = g
        return out
    sample("select_backward", lambda g: tc.select_backward(g, (3, 4, 5), 1, 2), [arr((3, 5))],
           lambda g: select_backward_ref(g, (3, 4, 5), 1, 2), F32, "dim 1, index 2")
    sample("select_backward", lambda g: tc.select_backward(g, [4], -1, -1), [np.array(2.5, F64)],
           lambda g: select_backward_ref(g, (4,), 0, -1), F64, "0-d grad, negative dim and index")
    sample("select_backward", lambda g: tc.select_backward(g, (2, 3), 0, 1), [arr((3,), I32)],
           lambda g: select_backward_ref(g, (2, 3), 0, 1), I32, "int32")

    def slice_backward_ref(g, sizes, d, start, end, step):
        out = np.zeros(sizes, g.dtype)
        out[(slice(None),) * d + (slice(start, end, step),)] = g
        return out
    sample("slice_backward", lambda g: tc.slice_backward(g, (3, 4, 5), 1, 1, 3, 1), [arr((3, 2, 5))],
           lambda g: slice_backward_ref(g, (3, 4, 5), 1, 1, 3, 1), F32, "dim 1, 1:3")
    sample("slice_backward", lambda g: tc.slice_backward(g, (5, 2), 0, 0, 5, 2), [arr((3, 2), F64)],
           lambda g: slice_backward_ref(g, (5, 2), 0, 0, 5, 2), F64, "step 2")
    sample("slice_backward", lambda g: tc.slice_backward(g, [4], -1, -3, 100, 1), [arr((3,), I64)],
           lambda g: slice_backward_ref(g, (4,), 0, -3, 100, 1), I64, "negative start, end past the size")
    sample("slice_backward", lambda g: tc.slice_backward(g, (3,), 0, 2, 2, 1), [np.zeros((0,), F32)],
           lambda g: np.zeros(3, F32), F32, "empty slice")


_index_samples()


# ---------------------------------------------------------------- padding, resizing, adaptive pooling

def _np_pad(x, pad, mode="constant", value=0.0):
    """PyTorch's pad: pairs from the last dim backwards; a negative pad crops.  Circular
    crops first and wraps what is left; the others pad the whole dim, then crop."""
    x = np.asarray(x)
    pairs = [(0, 0)] * (x.ndim - len(pad) // 2) + [(pad[2 * k], pad[2 * k + 1]) for k in reversed(range(len(pad) // 2))]
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape, pairs))
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if mode == "circular":
        return np.pad(x[crop], grow, mode="wrap")
    np_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}[mode]
    out = np.pad(x, grow, mode=np_mode, **({"constant_values": value} if mode == "constant" else {}))
    return out[tuple(slice(max(-lo, 0), out.shape[d] - max(-hi, 0)) for d, (lo, hi) in enumerate(pairs))]


def _np_resample(x, sizes, mode, align_corners=False, scales=None):
    """F.interpolate's nearest / nearest-exact / linear modes, one spatial dim after another."""
    x = np.asarray(x, np.float64)
    for k, m in enumerate(sizes):
        d, n = 2 + k, x.shape[2 + k]
        step = 1 / scales[k] if scales else n / m
        i = np.arange(m)
        if mode in ("nearest", "nearest-exact"):
            src = np.floor((i + (0.5 if mode == "nearest-exact" else 0)) * step).astype(int)
            x = np.take(x, np.minimum(src, n - 1), axis=d)
            continue
        src = i * ((n - 1) / (m - 1) if m > 1 else 0) if align_corners else np.maximum((i + 0.5) * step - 0.5, 0)
        lo = np.minimum(np.floor(src).astype(int), n - 1)
        w = (src - lo).reshape((-1,) + (1,) * (x.ndim - d - 1))
        x = np.take(x, lo, axis=d) * (1 - w) + np.take(x, np.minimum(lo + 1, n - 1), axis=d) * w
    return x


def _adaptive_windows(n, m):
    return [(i * n // m, -(-(i + 1) * n // m)) for i in range(m)]


def _np_adaptive_avg(x, sizes):
    x = np.asarray(x, np.float64)
    for k, m in enumerate(sizes):
        d = x.ndim - len(sizes) + k
        x = np.stack([x.take(range(a, b), axis=d).mean(axis=d) for a, b in _adaptive_windows(x.shape[d], m)], d)
    return x


def _np_adaptive_max(x, sizes):
    """(maxima, flat positions in the pooled plane of the first maximum, row-major)."""
    x = np.asarray(x, np.float64)
    plane = x.shape[-len(sizes):]
    flat = x.reshape(x.shape[:-len(sizes)] + (-1,))
    grids = [_adaptive_windows(n, m) for n, m in zip(plane, sizes)]
    values = np.zeros(x.shape[:-len(sizes)] + tuple(sizes))
    where = np.zeros(values.shape, np.int64)
    for out in np.ndindex(*sizes):
        ranges = [range(*grids[k][o]) for k, o in enumerate(out)]
        picks = np.ravel_multi_index(np.meshgrid(*ranges, indexing="ij"), plane).reshape(-1)
        window = flat[..., picks]
        values[(Ellipsis,) + out] = window.max(-1)
        where[(Ellipsis,) + out] = picks[window.argmax(-1)]
    return values, where


def _pad_resize_samples():
    for d in ALL:
        sample("constant_pad_nd", lambda x: tc.constant_pad_nd(x, (1, 2)), [arr((2, 3), d)],
               lambda x: _np_pad(x, (1, 2)), d, f"last dim (1, 2), {d}")
    sample("constant_pad_nd", lambda x: tc.constant_pad_nd(x, [0, 1, 2, 0], 1.5), [arr((2, 3, 4), F64)],
           lambda x: _np_pad(x, (0, 1, 2, 0), value=1.5), F64, "two dims, value 1.5")
    sample("constant_pad_nd", lambda x: tc.constant_pad_nd(x, (-1, 2, 1, -2), -3), [arr((4, 5))],
           lambda x: _np_pad(x, (-1, 2, 1, -2), value=-3), F32, "negative pads crop")
    sample("constant_pad_nd", lambda x: tc.constant_pad_nd(x, (1, 1, 1, 1, 1, 1), 2), [arr((1, 1, 2), I64)],
           lambda x: _np_pad(x, (1, 1, 1, 1, 1, 1), value=2), I64, "every dim, size-1 dims, int64")
    sample("constant_pad_nd", lambda x: tc.constant_pad_nd(x, (2, 0)), [np.zeros((2, 0), F32)],
           lambda x: _np_pad(x, (2, 0)), F32, "empty input dim: all padding")
    sample("constant_pad_nd", lambda x: tc.constant_pad_nd(x, ()), [arr((), F64)], lambda x: x, F64, "0-d, no pad")

    x4 = arr((2, 3, 4, 5), F64)
    for mode in ("reflect", "replicate", "circular"):
        sample("pad", lambda x, m=mode: tc.pad(x, (2, 1), m), [arr((2, 5))], lambda x, m=mode: _np_pad(x, (2, 1), m),
               F32, f"{mode} 1-D unbatched")
        sample("pad", lambda x, m=mode: tc.pad(x, (1, 2, 2, 0), mode=m), [x4],
               lambda x, m=mode: _np_pad(x, (1, 2, 2, 0), m), F64, f"{mode} 2-D batched")
        sample("pad", lambda x, m=mode: tc.pad(x, (-1, 2, 1, -2), m), [arr((3, 4, 5), F64)],
               lambda x, m=mode: _np_pad(x, (-1, 2, 1, -2), m), F64, f"{mode} negative pads")
        sample("pad", lambda x, m=mode: tc.pad(x, [1, 1, 0, 1, 1, 0], m), [arr((1, 2, 2, 3, 2), I64)],
               lambda x, m=mode: _np_pad(x, (1, 1, 0, 1, 1, 0), m), I64, f"{mode} 3-D, int64")
    sample("pad", lambda x: tc.pad(x, (1, 1), "replicate"), [arr((2, 3, 1))],
           lambda x: _np_pad(x, (1, 1), "replicate"), F32, "replicate a size-1 dim")
    sample("pad", lambda x: tc.pad(x, (1, 0, 0, 2)), [arr((2, 3), I32)], lambda x: _np_pad(x, (1, 0, 0, 2)), I32,
           "constant default")
    sample("pad", lambda x: tc.nn.functional.pad(x, (2, -1), value=0.5), [arr((3, 3), F64)],
           lambda x: _np_pad(x, (2, -1), value=0.5), F64, "tc.nn.functional.pad, value 0.5")

    x3, x4, x5 = arr((2, 3, 5), F64), arr((2, 2, 4, 5)), arr((1, 2, 3, 2, 4), F64)
    for mode in ("nearest", "nearest-exact"):
        sample("interpolate", lambda x, m=mode: tc.interpolate(x, size=7, mode=m), [x3],
               lambda x, m=mode: _np_resample(x, [7], m), F64, f"{mode} 1-D up, size")
        sample("interpolate", lambda x, m=mode: tc.interpolate(x, (3, 8), mode=m), [x4],
               lambda x, m=mode: _np_resample(x, [3, 8], m), F32, f"{mode} 2-D, size")
        sample("interpolate", lambda x, m=mode: tc.interpolate(x, scale_factor=1.5, mode=m), [x4],
               lambda x, m=mode: _np_resample(x, [6, 7], m, scales=[1.5, 1.5]), F32, f"{mode} scale_factor 1.5")
        sample("interpolate", lambda x, m=mode: tc.interpolate(x, scale_factor=(2.0, 0.5, 1.5), mode=m), [x5],
               lambda x, m=mode: _np_resample(x, [6, 1, 6], m, scales=[2.0, 0.5, 1.5]), F64,
               f"{mode} 3-D, scale per dim")
    for ac in (False, True):
        sample("interpolate", lambda x, a=ac: tc.interpolate(x, 8, mode="linear", align_corners=a), [x3],
               lambda x, a=ac: _np_resample(x, [8], "linear", a), F64, f"linear up, align_corners={ac}")
        sample("interpolate", lambda x, a=ac: tc.interpolate(x, (3, 7), mode="bilinear", align_corners=a), [x4],
               lambda x, a=ac: _np_resample(x, [3, 7], "linear", a), F32, f"bilinear, align_corners={ac}")
        sample("interpolate", lambda x, a=ac: tc.interpolate(x, (3, 1), mode="bilinear", align_corners=a),
               [arr((1, 2, 1, 3), F64)], lambda x, a=ac: _np_resample(x, [3, 1], "linear", a), F64,
               f"bilinear from and to size 1, align_corners={ac}")
        sample("interpolate", lambda x, a=ac: tc.interpolate(x, (4, 3, 5), mode="trilinear", align_corners=a), [x5],
               lambda x, a=ac: _np_resample(x, [4, 3, 5], "linear", a), F64, f"trilinear, align_corners={ac}")
    sample("interpolate", lambda x: tc.interpolate(x, scale_factor=(0.75, 1.4), mode="bilinear"), [x4],
           lambda x: _np_resample(x, [3, 7], "linear", scales=[0.75, 1.4]), F32, "bilinear, scale_factor used as given")
    sample("interpolate", lambda x: tc.interpolate(x, scale_factor=(0.75, 1.4), mode="bilinear",
                                                   recompute_scale_factor=True), [x4],
           lambda x: _np_resample(x, [3, 7], "linear"), F32, "bilinear, recompute_scale_factor")
    sample("interpolate", lambda x: tc.interpolate(x, (3, 2), mode="area"), [x4],
           lambda x: _np_adaptive_avg(x, [3, 2]), F32, "area")

    sample("adaptive_avg_pool1d", lambda x: tc.adaptive_avg_pool1d(x, 3), [arr((2, 3, 7), F64)],
           lambda x: _np_adaptive_avg(x, [3]), F64, "7 -> 3, uneven windows")
    sample("adaptive_avg_pool1d", lambda x: tc.adaptive_avg_pool1d(x, [1]), [arr((3, 5))],
           lambda x: _np_adaptive_avg(x, [1]), F32, "global, unbatched")
    sample("adaptive_avg_pool2d", lambda x: tc.adaptive_avg_pool2d(x, (3, 2)), [arr((2, 3, 7, 5), F64)],
           lambda x: _np_adaptive_avg(x, [3, 2]), F64, "(7, 5) -> (3, 2), uneven windows")
    sample("adaptive_avg_pool2d", lambda x: tc.adaptive_avg_pool2d(x, 4), [arr((2, 3, 5))],
           lambda x: _np_adaptive_avg(x, [4, 4]), F32, "unbatched, up: overlapping windows")
    sample("adaptive_avg_pool2d", lambda x: tc.nn.functional.adaptive_avg_pool2d(x, (None, 1)),
           [arr((1, 2, 4, 3), F64)], lambda x: _np_adaptive_avg(x, [4, 1]), F64, "None keeps a dim")
    for shape, size, desc in (((2, 3, 7, 5), (3, 2), "uneven windows"), ((3, 4, 3), (5, None), "unbatched, up, None"),
                              ((1, 2, 1, 4), (1, 1), "size-1 dim, global")):
        x = distinct(shape, F64)
        sizes = [n if s is None else s for s, n in zip(size, shape[-2:])]
        sample("adaptive_max_pool2d", lambda x, s=size: tc.adaptive_max_pool2d(x, s), [x],
               lambda x, s=sizes: _np_adaptive_max(x, s)[0], F64, desc)
        sample("adaptive_max_pool2d", lambda x, s=size: tc.adaptive_max_pool2d(x, s, return_indices=True), [x],
               lambda x, s=sizes: _np_adaptive_max(x, s), (F64, I64), f"{desc}, return_indices")
    sample("adaptive_max_pool2d", lambda x: tc.adaptive_max_pool2d(x, 2, True), [np.ones((1, 3, 3), F32)],
           lambda x: _np_adaptive_max(x, [2, 2]), (F32, I64), "ties: the first in row-major order")
    sample("adaptive_max_pool1d", lambda x: tc.adaptive_max_pool1d(x, 3, True), [distinct((2, 3, 7), F64)],
           lambda x: _np_adaptive_max(x, [3]), (F64, I64), "7 -> 3, return_indices")
    sample("adaptive_max_pool1d", lambda x: tc.nn.functional.adaptive_max_pool1d(x, 4), [distinct((3, 2), F32)],
           lambda x: _np_adaptive_max(x, [4])[0], F32, "unbatched, up")


_pad_resize_samples()


# ---------------------------------------------------------------- casts

def _cast(d):
    return lambda x: x.astype(d)


def _cast_samples():
    x = np.array([-2.7, -0.5, 0.0, 0.5, 1.9, 3.0], F32)
    sample("to", lambda x: x.to(tc.float64), [x], _cast(F64), F64, "x.to(tc.float64)")
    sample("to", lambda x: x.to(tc.int32), [x], _cast(I32), I32, "float to int truncates")
    sample("to", lambda x: x.to("int64"), [arr((4,), I32)], _cast(I64), I64, "x.to('int64')")
    sample("to", lambda x: x.to(np.float32), [arr((2, 2), B)], _cast(F32), F32, "bool to np.float32")
    sample("to", lambda x: x.to(dtype=tc.bool), [x], _cast(B), B, "float to bool")
    sample("to", lambda x: x.to(tc.float32), [arr((3,), F32)], lambda x: x, F32, "same dtype")
    special = np.array([np.nan, np.inf, -np.inf, 3.7, -3.7, 1e10, -1e10, 2.0 ** 31, -2.0 ** 31, 2.0 ** 63], F64)
    for d in (I32, I64):
        sample("to", lambda x, d=d: x.to(d), [special], int_cast(d), d, f"nan, inf, out of range to {d}: INT_MIN")
        sample("to", lambda x, d=d: x.to(d), [special.astype(F32)], int_cast(d), d, f"f32 nan, inf to {d}")
    sample("to.dtype", lambda x: x.to(tc.float64, False, True), [x], _cast(F64), F64,
           "x.to(tc.float64, non_blocking, copy)")
    sample("to.dtype", lambda x: x.to(tc.int32, memory_format="contiguous_format"), [x], _cast(I32), I32,
           "memory_format=")
    sample("to.device", lambda x: x.to("cpu"), [x], lambda x: x, F32, "x.to('cpu')")
    sample("to.device", lambda x: x.to("cpu:0", tc.int64), [x], _cast(I64), I64, "device and dtype")
    sample("to.other", lambda x, y: x.to(y), [x, arr((2,), F64)], lambda x, y: x.astype(F64), F64,
           "x.to(other) takes its dtype")
    for name, d in (("float", F32), ("double", F64), ("int", I32), ("long", I64), ("bool", B),
                    ("half", "float16"), ("bfloat16", "bfloat16")):
        for src in (F32, I64, B):
            v = x if src == F32 else arr((6,), src)
            sample(name, lambda t, n=name: getattr(t, n)(), [v], _cast(d), d, f"x.{name}() from {src}")
        sample(name, lambda t, n=name: getattr(t, n)(memory_format="preserve_format"), [x], _cast(d), d,
               "memory_format=")


_cast_samples()


# ---------------------------------------------------------------- factories

def _factory_samples():
    sample("empty", lambda: tc.empty((2, 3)), [], lambda: np.zeros((2, 3)), F32, "zeros, never garbage")
    sample("empty", lambda: tc.empty([4], dtype=tc.int32), [], lambda: np.zeros(4), I32, "dtype=int32")
    sample("empty_like", tc.empty_like, [arr((3,), I64)], np.zeros_like, I64, "like int64")
    sample("empty_like", lambda x: tc.empty_like(x, dtype=tc.float64), [arr((2, 2), F32)], np.zeros_like, F64,
           "dtype=float64")
    sample("eye", lambda: tc.eye(3), [], lambda: np.eye(3), F32, "tc.eye(3)")
    sample("eye", lambda: tc.eye(2, 4, dtype=tc.int64), [], lambda: np.eye(2, 4), I64, "2x4 int64")
    sample("eye", lambda: tc.eye(0), [], lambda: np.eye(0), F32, "empty")
    sample("linspace", lambda: tc.linspace(-1, 2, 7), [], lambda: np.linspace(-1, 2, 7), F32, "7 steps")
    sample("linspace", lambda: tc.linspace(3.0, -3.0, 6, dtype=tc.float64), [], lambda: np.linspace(3, -3, 6),
           F64, "decreasing f64")
    sample("linspace", lambda: tc.linspace(0, 1, 1), [], lambda: np.array([0.0]), F32, "one step")
    sample("linspace", lambda: tc.linspace(0, 1, 0), [], lambda: np.zeros(0), F32, "no steps")
    sample("logspace", lambda: tc.logspace(0, 2, 3), [], lambda: np.logspace(0, 2, 3), F32, "base 10")
    sample("logspace", lambda: tc.logspace(-1, 1, 5, base=2.0, dtype=tc.float64), [],
           lambda: np.logspace(-1, 1, 5, base=2.0), F64, "base 2 f64")
    lo, hi = np.array(-1.5), np.array(2.5)
    for name, np_fn in (("linspace", np.linspace), ("logspace", np.logspace)):
        fn = getattr(tc, name)
        sample(f"{name}.Tensor_Tensor", lambda s, e, f=fn: f(s, e, 5, dtype=tc.float64), [lo, hi],
               lambda s, e, f=np_fn: f(s, e, 5), F64, f"tc.{name}(start, end, 5), 0-d tensors")
        sample(f"{name}.Tensor_Scalar", lambda s, f=fn: f(s, 2.0, 4), [lo.astype(F32)],
               lambda s, f=np_fn: f(s, 2.0, 4), F32, "a tensor start")
        sample(f"{name}.Tensor_Scalar", lambda s, f=fn: f(s, 2.0, 4, dtype=tc.float64), [lo],
               lambda s, f=np_fn: f(s, 2.0, 4), F64, "a tensor start, float64")
        sample(f"{name}.Scalar_Tensor", lambda e, f=fn: f(-1.0, e, 3, dtype=tc.float64), [hi],
               lambda e, f=np_fn: f(-1.0, e, 3), F64, "a tensor end")
    sample("tril_indices", lambda: tc.tril_indices(3, 4, 1), [], lambda: np.array(np.tril_indices(3, 1, 4)), I64,
           "3x4 offset 1")
    sample("tril_indices", lambda: tc.tril_indices(2, 2, dtype=tc.int32), [], lambda: np.array(np.tril_indices(2)),
           I32, "int32")
    sample("triu_indices", lambda: tc.triu_indices(4, 3, -1), [], lambda: np.array(np.triu_indices(4, -1, 3)), I64,
           "4x3 offset -1")
    sample("full", lambda: tc.full((2, 3), 1.5), [], lambda: np.full((2, 3), 1.5), F32, "float fill -> float32")
    sample("full", lambda: tc.full([3], 7), [], lambda: np.full(3, 7), I64, "int fill -> int64")
    sample("full", lambda: tc.full((2,), True), [], lambda: np.full(2, True), B, "bool fill -> bool")
    sample("full", lambda: tc.full((2, 2), 2, dtype=tc.float64), [], lambda: np.full((2, 2), 2.0), F64, "dtype=")
    sample("full", lambda: tc.full((), -1.0, dtype=tc.int32), [], lambda: np.array(-1), I32, "0-d, float to int32")
    sample("full", lambda: tc.full((0, 3), 1.0), [], lambda: np.zeros((0, 3)), F32, "empty")
    for name, v in (("zeros", 0), ("ones", 1)):
        t = getattr(tc, name)
        sample(name, lambda t=t: t(2, 3), [], lambda v=v: np.full((2, 3), v), F32, f"tc.{name}(2, 3)")
        sample(name, lambda t=t: t((4,), dtype=tc.int32), [], lambda v=v: np.full(4, v), I32, "dtype=int32")
        sample(name, lambda t=t: t([2], dtype=tc.bool), [], lambda v=v: np.full(2, bool(v)), B, "dtype=bool")
        sample(name, lambda t=t: t((), dtype=tc.float64), [], lambda v=v: np.array(float(v)), F64, "0-d f64")
    for name, fill in (("zeros_like", lambda x: np.zeros_like(x)), ("ones_like", lambda x: np.ones_like(x))):
        t = getattr(tc, name)
        for d in (F32, I32, B):
            sample(name, t, [arr((2, 3), d)], fill, d, f"{d}")
        sample(name, lambda x, t=t: t(x, dtype=tc.float64), [arr((3,), I64)], fill, F64, "dtype=float64")
    sample("full_like", lambda x: tc.full_like(x, 2.5), [arr((2, 2), F64)], lambda x: np.full_like(x, 2.5), F64,
           "f64 x, 2.5")
    sample("full_like", lambda x: tc.full_like(x, 3), [arr((3,), I32)], lambda x: np.full_like(x, 3), I32, "int32")
    sample("full_like", lambda x: tc.full_like(x, 2.7), [arr((3,), I64)], lambda x: np.full(3, 2), I64,
           "float fill in an int64 tensor truncates")
    sample("full_like", lambda x: tc.full_like(x, 1, dtype=tc.bool), [arr((2,), F32)], lambda x: np.ones(2, bool),
           B, "dtype=bool")
    sample("arange", lambda: tc.arange(5), [], lambda: np.arange(5), I64, "tc.arange(5) int64")
    sample("arange", lambda: tc.arange(4.0), [], lambda: np.arange(4.0), F32, "float end -> float32")
    sample("arange", lambda: tc.arange(3, dtype=tc.float64), [], lambda: np.arange(3.0), F64, "dtype=float64")
    sample("arange", lambda: tc.arange(0), [], lambda: np.arange(0), I64, "empty")
    sample("arange", lambda: tc.arange(2.5), [], lambda: np.arange(2.5), F32, "fractional end")
    sample("arange.start", lambda: tc.arange(1, 10, 3), [], lambda: np.arange(1, 10, 3), I64, "(1, 10, 3)")
    sample("arange.start", lambda: tc.arange(-2, 3), [], lambda: np.arange(-2, 3), I64, "(-2, 3)")
    sample("arange.start", lambda: tc.arange(0.0, -8.000001, -4.0, dtype=tc.int64), [],
           lambda: np.array([0, -4]), I64, "float bounds, int64: each bound truncated first")
    sample("arange.start", lambda: tc.arange(0.5, 5, 1.5, dtype=tc.int32), [],
           lambda: np.arange(0, 5, 1), I32, "(0.5, 5, 1.5) int32 counts (0, 5, 1)")
    sample("arange.start", lambda: tc.arange(0, 4, device="cpu"), [], lambda: np.arange(4), I64, "device='cpu'")
    sample("zeros", lambda: tc.zeros(2, 2, device="cpu"), [], lambda: np.zeros((2, 2)), F32, "device='cpu'")
    sample("full_like", lambda x: tc.full_like(x, 2, device="cpu", memory_format="preserve_format"), [arr((2,), F32)],
           lambda x: np.full(2, 2.0), F32, "device=, memory_format=")
    sample("arange.start", lambda: tc.arange(0, 1, 0.25), [], lambda: np.arange(0, 1, 0.25), F32, "float step")
    sample("arange.start", lambda: tc.arange(10, 0, -3), [], lambda: np.arange(10, 0, -3), I64, "negative step")
    sample("arange.start", lambda: tc.arange(1, 2.5, 0.5, dtype=tc.float64), [],
           lambda: np.arange(1, 2.5, 0.5), F64, "dtype=float64")
    sample("arange.start", lambda: tc.arange(0, 5, 2, dtype=tc.int32), [], lambda: np.arange(0, 5, 2), I32,
           "dtype=int32")
    for name in ("rand", "randn"):
        t = getattr(tc, name)
        sample(name, lambda t=t: t(2, 3), [], None, F32, f"tc.{name}(2, 3)", nondeterministic=True, shape=(2, 3))
        sample(name, lambda t=t: t((4,), dtype=tc.float64), [], None, F64, "dtype=float64",
               nondeterministic=True, shape=(4,))
        sample(name, lambda t=t: t([]), [], None, F32, "0-d", nondeterministic=True, shape=())


_factory_samples()


# ------------------------------------------------------------------ sliding windows (issue 12)
# The references compute each output element's window sum directly (one einsum per kernel
# position over the zero-padded input), independent of im2col.

def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _np_window_views(x, k, d, p, s, fill=0.0):
    """Per kernel position (i, j): the padded input's values that position reads, (..., OH, OW)."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = map(_pair, (k, d, p, s))
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(ph, ph), (pw, pw)], constant_values=fill)
    oh = (xp.shape[-2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[-1] - dw * (kw - 1) - 1) // sw + 1
    return {(i, j): xp[..., i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            for i in range(kh) for j in range(kw)}


def _np_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    views = _np_window_views(x, w.shape[-2:], dilation, padding, stride)
    cg, og = w.shape[1], w.shape[0] // groups
    out = 0
    for (i, j), v in views.items():
        parts = [np.einsum("...chw,oc->...ohw", v[..., g * cg:(g + 1) * cg, :, :], w[g * og:(g + 1) * og, :, i, j])
                 for g in range(groups)]
        out = out + np.concatenate(parts, axis=-3)
    return out if b is None else out + b[:, None, None]


def _np_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = map(_pair, (stride, padding, output_padding, dilation))
    n_in, og, kh, kw = w.shape
    cg = n_in // groups
    h, wd = x.shape[-2:]
    full = np.zeros(x.shape[:-3] + (og * groups, (h - 1) * sh + dh * (kh - 1) + 1 + oph,
                                    (wd - 1) * sw + dw * (kw - 1) + 1 + opw))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                part = np.einsum("...chw,co->...ohw", x[..., g * cg:(g + 1) * cg, :, :], w[g * cg:(g + 1) * cg, :, i, j])
                full[..., g * og:(g + 1) * og, i * dh:i * dh + (h - 1) * sh + 1:sh,
                     j * dw:j * dw + (wd - 1) * sw + 1:sw] += part
    out = full[..., ph:full.shape[-2] - ph, pw:full.shape[-1] - pw]
    return out if b is None else out + b[:, None, None]


def _np_im2col(x, k, d=1, p=0, s=1):
    views = _np_window_views(x, k, d, p, s)
    cols = np.stack(list(views.values()), axis=-3)           # (..., C, kk, OH, OW)
    return cols.reshape(x.shape[:-3] + (-1, cols.shape[-2] * cols.shape[-1]))


def _np_col2im(cols, size, k, d=1, p=0, s=1):
    (kh, kw), (ph, pw) = _pair(k), _pair(p)
    plane = np.zeros(cols.shape[:-2] + (cols.shape[-2] // (kh * kw),) + tuple(size))
    views = _np_window_views(plane, k, d, p, s)
    blocks = cols.reshape(plane.shape[:-2] + (kh * kw,) + next(iter(views.values())).shape[-2:])
    padded = np.pad(plane, [(0, 0)] * (plane.ndim - 2) + [(ph, ph), (pw, pw)])
    (dh, dw), (sh, sw) = _pair(d), _pair(s)
    oh, ow = blocks.shape[-2:]
    for n, (i, j) in enumerate(views):
        padded[..., i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw] += blocks[..., n, :, :]
    return padded[..., ph:ph + size[0], pw:pw + size[1]]


def _np_max_pool2d(x, k, s=None, p=0, d=1):
    return np.max(np.stack(list(_np_window_views(x, k, d, p, s or k, fill=-np.inf).values())), axis=0)


def _np_avg_pool2d(x, k, s=None, p=0):
    views = _np_window_views(x, k, 1, p, s or k)
    return sum(views.values()) / len(views)


def _window_samples():
    x = arr((2, 4, 7, 6), F64)
    sample("im2col", lambda x: tc.im2col(x, (2, 3)), [x], lambda x: _np_im2col(x, (2, 3)), F64, "kernel (2, 3)")
    sample("im2col", lambda x: tc.im2col(x, 3, (1, 2), 1, 2), [x], lambda x: _np_im2col(x, 3, (1, 2), 1, 2), F64,
           "dilation, padding, stride")
    sample("im2col", lambda x: tc.im2col(x, 2, padding=(0, 1)), [arr((3, 4, 4), F32)],
           lambda x: _np_im2col(x, 2, p=(0, 1)), F32, "unbatched")
    sample("col2im", lambda c: tc.col2im(c, (7, 6), (2, 3)), [arr((2, 24, 24), F64)],
           lambda c: _np_col2im(c, (7, 6), (2, 3)), F64, "kernel (2, 3): overlaps add up")
    sample("col2im", lambda c: tc.col2im(c, (7, 6), 3, (1, 2), 1, 2), [arr((2, 36, 8), F64)],
           lambda c: _np_col2im(c, (7, 6), 3, (1, 2), 1, 2), F64, "dilation, padding, stride")
    sample("col2im", lambda c: tc.col2im(c, [3, 3], 2, stride=2, padding=1), [arr((8, 4), F32)],
           lambda c: _np_col2im(c, (3, 3), 2, 1, 1, 2), F32, "unbatched")

    w, b = arr((6, 2, 3, 2), F64), arr((6,), F64)
    sample("conv2d", tc.conv2d, [x, arr((3, 4, 3, 3), F64)], _np_conv2d, F64, "tc.conv2d(x, w)")
    sample("conv2d", lambda x, w, b: tc.conv2d(x, w, b, (2, 1), (1, 2), (1, 2), 2), [x, w, b],
           lambda x, w, b: _np_conv2d(x, w, b, (2, 1), (1, 2), (1, 2), 2), F64, "bias, stride, padding, dilation, groups")
    sample("conv2d", lambda x, w: tc.conv2d(x, w, stride=2), [arr((3, 5, 5), F32), arr((2, 3, 2, 2), F32)],
           lambda x, w: _np_conv2d(x, w, stride=2), F32, "unbatched", rtol=1e-5, atol=1e-5)
    sample("conv2d.padding", lambda x, w: tc.conv2d(x, w, padding="same", dilation=(1, 2)), [x, arr((3, 4, 2, 3), F64)],
           lambda x, w: _np_conv2d(np.pad(x, [(0, 0), (0, 0), (0, 1), (0, 0)]), w, padding=(0, 2), dilation=(1, 2)),
           F64, "padding='same', an even kernel: the odd row after")
    sample("conv2d.padding", lambda x, w: tc.conv2d(x, w, padding="valid"), [x, arr((3, 4, 3, 3), F64)],
           _np_conv2d, F64, "padding='valid'")
    x1, w1 = arr((2, 4, 9), F64), arr((4, 2, 3), F64)
    sample("conv1d", lambda x, w: tc.conv1d(x, w, None, 2, 1, 2, 2), [x1, w1],
           lambda x, w: _np_conv2d(x[:, :, None], w[:, :, None], None, (1, 2), (0, 1), (1, 2), 2)[:, :, 0],
           F64, "stride, padding, dilation, groups")
    sample("conv1d.padding", lambda x, w, b: tc.conv1d(x, w, b, padding="same"), [x1[0], arr((3, 4, 3), F64), arr((3,), F64)],
           lambda x, w, b: _np_conv2d(x[:, None], w[:, :, None], b, 1, (0, 1))[:, 0], F64, "padding='same', unbatched")
    sample("conv_transpose2d", tc.conv_transpose2d, [x, arr((4, 3, 3, 2), F64)], _np_conv_transpose2d, F64,
           "tc.conv_transpose2d(x, w)")
    sample("conv_transpose2d", lambda x, w, b: tc.conv_transpose2d(x, w, b, (2, 3), (1, 0), (1, 2), 2, (1, 2)),
           [x, arr((4, 3, 3, 2), F64), arr((6,), F64)],
           lambda x, w, b: _np_conv_transpose2d(x, w, b, (2, 3), (1, 0), (1, 2), 2, (1, 2)), F64,
           "stride, padding, output_padding, groups, dilation")

    sample("max_pool2d", lambda x: tc.max_pool2d(x, 2), [x], lambda x: _np_max_pool2d(x, 2), F64, "kernel 2")
    sample("max_pool2d", lambda x: tc.max_pool2d(x, (3, 2), (2, 1), 1, (1, 2)), [x],
           lambda x: _np_max_pool2d(x, (3, 2), (2, 1), 1, (1, 2)), F64, "stride, padding, dilation")
    sample("max_pool2d", lambda x: tc.max_pool2d(x, 3, 2, ceil_mode=True), [arr((3, 6, 6), F32)],
           lambda x: _np_max_pool2d(np.pad(x, [(0, 0), (0, 1), (0, 1)], constant_values=-np.inf), 3, 2), F32,
           "ceil_mode, unbatched")
    sample("max_pool2d", lambda x: tc.max_pool2d(x, 2, return_indices=True)[1], [arr((1, 2, 4, 4), F32)],
           lambda x: np.stack(list(_np_window_views(x, 2, 1, 0, 2).values())).argmax(0)
           // 2 * 4 + np.arange(2)[:, None] * 8 + np.stack(list(_np_window_views(x, 2, 1, 0, 2).values())).argmax(0) % 2
           + np.arange(2) * 2, I64, "return_indices: h * W + w")
    sample("avg_pool2d", lambda x: tc.avg_pool2d(x, 2), [x], lambda x: _np_avg_pool2d(x, 2), F64, "kernel 2")
    sample("avg_pool2d", lambda x: tc.avg_pool2d(x, 3, 2, 1), [x], lambda x: _np_avg_pool2d(x, 3, 2, 1), F64,
           "padding counts")
    sample("avg_pool2d", lambda x: tc.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [x],
           lambda x: _np_avg_pool2d(x, 3, 2, 1) * 9 / _np_avg_pool2d(np.ones_like(x), 3, 2, 1) / 9, F64,
           "count_include_pad=False")
    sample("avg_pool2d", lambda x: tc.avg_pool2d(x, 2, divisor_override=3), [arr((3, 4, 4), F32)],
           lambda x: _np_avg_pool2d(x, 2) * 4 / 3, F32, "divisor_override, unbatched", rtol=1e-5, atol=1e-6)

    q, k, v = arr((2, 3, 4, 5), F64), arr((2, 3, 6, 5), F64), arr((2, 3, 6, 2), F64)
    sample("scaled_dot_product_attention", tc.scaled_dot_product_attention, [q, k, v], _np_attention, F64,
           "tc.scaled_dot_product_attention(q, k, v)")
    sample("scaled_dot_product_attention", lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5),
           [q, k, v], lambda q, k, v: _np_attention(q, k, v, np.tril(np.ones((4, 6), bool)), 0.5), F64, "is_causal, scale")
    sample("scaled_dot_product_attention", lambda q, k, v, m: tc.scaled_dot_product_attention(q, k, v, m),
           [q, k, v, arr((4, 6), F64)], _np_attention, F64, "an additive mask")
    keep = np.ones((4, 6), bool)
    keep[1, :] = False
    keep[2, ::2] = False
    sample("scaled_dot_product_attention", lambda q, k, v, m: tc.scaled_dot_product_attention(q, k, v, m),
           [arr((4, 5), F32), arr((6, 5), F32), arr((6, 3), F32), keep], _np_attention, F32,
           "a bool mask, one row masked throughout (it attends to nothing: 0), 2-D", rtol=1e-5, atol=1e-6)
    sample("scaled_dot_product_attention", lambda q, k, v: tc.scaled_dot_product_attention(q, k, v, enable_gqa=True),
           [arr((1, 4, 3, 5), F64), arr((1, 2, 6, 5), F64), arr((1, 2, 6, 2), F64)],
           lambda q, k, v: _np_attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1)), F64, "enable_gqa: 2 query heads per key head")


def _np_attention(q, k, v, mask=None, scale=None):
    scores = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and mask.dtype == bool:
        scores = np.where(mask, scores, -np.inf)
    elif mask is not None:
        scores = scores + mask
    top = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0))
    return (e / np.maximum(e.sum(-1, keepdims=True), 1e-300)) @ v



def _np_flash(q, k, v, mask=None, scale=None):
    """(output, logsumexp) of the fused attention op."""
    scores = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    top = scores.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(scores - np.where(np.isfinite(top), top, 0)).sum(-1, keepdims=True)))[..., 0]
    return _np_attention(q, k, v, mask, scale), lse


def _np_flash_backward(g, q, k, v, out, lse, mask=None, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    p = np.exp(scores - lse[..., None])
    ds = p * (g @ np.swapaxes(v, -1, -2) - (g * out).sum(-1, keepdims=True)) * scale
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


def _flash_samples():
    """The fused attention op and its backward (scaled_dot_product_attention without dropout
    decomposes to the first); tests/library/test_attention.py walks several key blocks."""
    flash, backward = tc._scaled_dot_product_flash_attention_for_cpu, tc._scaled_dot_product_flash_attention_for_cpu_backward
    q, k, v = arr((2, 3, 4, 5), F64), arr((2, 3, 6, 5), F64), arr((2, 3, 6, 2), F64)
    causal = np.tril(np.ones((4, 6), bool))
    sample("_scaled_dot_product_flash_attention_for_cpu", lambda q, k, v: flash(q, k, v), [q[0], k[0], v[0]],
           _np_flash, (F64, F64), "(output, logsumexp)")
    sample("_scaled_dot_product_flash_attention_for_cpu", lambda q, k, v: flash(q, k, v, 0.0, True, scale=0.5),
           [q, k, v], lambda q, k, v: _np_flash(q, k, v, causal, 0.5), (F64, F64), "is_causal, scale")
    sample("_scaled_dot_product_flash_attention_for_cpu", lambda q, k, v, m: flash(q, k, v, attn_mask=m),
           [arr((3, 4, 5), F32), arr((3, 6, 5), F32), arr((3, 6, 3), F32), arr((3, 1, 6), F32)],
           lambda q, k, v, m: _np_flash(q, k, v, m), (F32, F32), "an additive mask broadcast over rows",
           rtol=1e-5, atol=1e-6)
    q, k, v = q[0, :2, :3, :3], k[0, :2, :4, :3], v[0, :2, :4]     # second derivatives of 6 inputs: keep it small
    lower = causal[:3, :4]
    g, out = arr((2, 3, 2), F64), _np_flash(q, k, v, lower)
    sample("_scaled_dot_product_flash_attention_for_cpu_backward",
           lambda g, q, k, v, o, l: backward(g, q, k, v, o, l, 0.0, True), [g, q, k, v, *out],
           lambda g, q, k, v, o, l: _np_flash_backward(g, q, k, v, o, l, lower), (F64, F64, F64), "is_causal")
    keep = arr((3, 4), F64) > -0.5
    keep[:, 0] = True                  # no row masked throughout: its logsumexp is -inf
    out = _np_flash(q, k, v, keep, 0.3)
    sample("_scaled_dot_product_flash_attention_for_cpu_backward",
           lambda g, q, k, v, o, l, m: backward(g, q, k, v, o, l, 0.0, False, attn_mask=m, scale=0.3),
           [g, q, k, v, *out, keep], lambda g, q, k, v, o, l, m: _np_flash_backward(g, q, k, v, o, l, m, 0.3),
           (F64, F64, F64), "a bool mask, scale")


_window_samples()
_flash_samples()


# ---------------------------------------------------------------- normalization layers, embedding (issue 12)

def _normalized(x, axes, eps):
    mu = x.mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


def _per_channel(v, x):
    return v.reshape([-1] + [1] * (x.ndim - 2))


def _affine(out, x, w, b):
    out = out if w is None else out * _per_channel(w, x)
    return out if b is None else out + _per_channel(b, x)


def _batch_norm(x, rm=None, rv=None, w=None, b=None, training=False, eps=1e-5):
    if training:
        return _affine(_normalized(x, (0,) + tuple(range(2, x.ndim)), eps), x, w, b)
    return _affine((x - _per_channel(rm, x)) / np.sqrt(_per_channel(rv, x) + eps), x, w, b)


def _instance_norm(x, w=None, b=None, eps=1e-5):
    return _affine(_normalized(x, tuple(range(2, x.ndim)), eps), x, w, b)


def _group_norm(x, groups, w=None, b=None, eps=1e-5):
    grouped = x.reshape(x.shape[0], groups, -1)
    return _affine(_normalized(grouped, (2,), eps).reshape(x.shape), x, w, b)


def _rms_norm(x, n, w=None, eps=2.0 ** -23):
    out = x / np.sqrt((x * x).mean(axis=tuple(range(x.ndim - n, x.ndim)), keepdims=True) + eps)
    return out if w is None else out * w


def _one_hot(t, n):
    return (t[..., None] == np.arange(n)).astype(np.int64)


def _norm_layer_samples():
    tol = dict(rtol=1e-4, atol=1e-5)
    x = arr((4, 3, 2))
    rm, rv, w, b = arr((2,), F64), pos((2,), F64), arr((2,), F64), arr((2,), F64)
    sample("batch_norm", lambda x: tc.batch_norm(x, None, None, training=True), [x],
           lambda x: _batch_norm(x, training=True), F32, "training, no running stats", **tol)
    sample("batch_norm", tc.batch_norm, [arr((3, 2, 4), F64), rm, rv, w, b], _batch_norm, F64,
           "evaluation: running stats, weight, bias")
    sample("batch_norm", lambda x, w, b: tc.batch_norm(x, None, None, w, b, training=True, eps=1e-3),
           [arr((5, 3), F64), arr((3,), F64), arr((3,), F64)],
           lambda x, w, b: _batch_norm(x, w=w, b=b, training=True, eps=1e-3), F64, "training, 2-D, weight, bias, eps")
    sample("batch_norm", lambda x, rm, rv: tc.batch_norm(x, rm, rv, eps=0.5), [arr((2, 2, 3, 2)), rm.astype(F32),
           rv.astype(F32)], lambda x, rm, rv: _batch_norm(x, rm, rv, eps=0.5), F32, "evaluation, 4-D, eps", **tol)
    sample("instance_norm", tc.instance_norm, [x], _instance_norm, F32, "defaults", **tol)
    sample("instance_norm", lambda x, w, b: tc.instance_norm(x, weight=w, bias=b, eps=1e-3),
           [arr((2, 2, 2, 3), F64), w, b], lambda x, w, b: _instance_norm(x, w, b, 1e-3), F64, "4-D, weight, bias, eps")
    sample("instance_norm", lambda x, rm, rv, w: tc.instance_norm(x, rm, rv, w, use_input_stats=False),
           [arr((3, 2, 4), F64), rm, rv, w], lambda x, rm, rv, w: _batch_norm(x, rm, rv, w), F64,
           "use_input_stats=False: the running stats")
    sample("group_norm", lambda x: tc.group_norm(x, 2), [arr((2, 6, 3))], lambda x: _group_norm(x, 2), F32,
           "2 groups", **tol)
    sample("group_norm", lambda x, w, b: tc.group_norm(x, 4, w, b, eps=1e-3), [arr((2, 4, 2, 2), F64),
           arr((4,), F64), arr((4,), F64)], lambda x, w, b: _group_norm(x, 4, w, b, 1e-3), F64,
           "a group per channel, weight, bias, eps")
    sample("group_norm", lambda x, b: tc.group_norm(x, 1, bias=b), [arr((3, 4), F64), arr((4,), F64)],
           lambda x, b: _group_norm(x, 1, b=b), F64, "one group, 2-D, bias")
    sample("rms_norm", lambda x: tc.rms_norm(x, (4,)), [arr((3, 4))], lambda x: _rms_norm(x, 1), F32,
           "eps=None: float32's epsilon", **tol)
    sample("rms_norm", lambda x, w: tc.rms_norm(x, [3, 4], w, eps=1e-3), [arr((2, 3, 4), F64), arr((3, 4), F64)],
           lambda x, w: _rms_norm(x, 2, w, 1e-3), F64, "2 dims, weight, eps")
    sample("rms_norm", lambda x: tc.rms_norm(x, [2]), [arr((2,), F64)], lambda x: _rms_norm(x, 1, eps=2.0 ** -52),
           F64, "eps=None: float64's epsilon")
    table = arr((5, 3), F64)
    sample("embedding", tc.embedding, [np.array([[0, 4, 2], [2, 2, 1]]), table.astype(F32)],
           lambda i, w: w[i], F32, "2-D indices")
    sample("embedding", tc.embedding, [np.array([3, 0, 3], I32), table], lambda i, w: w[i], F64, "int32 indices")
    sample("embedding", tc.embedding, [np.array(4), table], lambda i, w: w[i], F64, "0-d index")
    sample("embedding", lambda i, w: tc.embedding(i, w, padding_idx=2), [np.array([[0, 2], [2, 1]]), table],
           lambda i, w: w[i], F64, "padding_idx: its rows are read")
    sample("one_hot", lambda t: tc.one_hot(t, 4), [np.array([0, 3, 1, 1])], lambda t: _one_hot(t, 4), I64,
           "num_classes=4")
    sample("one_hot", lambda t: tc.one_hot(t, num_classes=3), [np.array([[2, 0], [1, 1]])], lambda t: _one_hot(t, 3),
           I64, "2-D")
    sample("one_hot", lambda t: tc.one_hot(t, 5), [np.array(2)], lambda t: _one_hot(t, 5), I64, "0-d")
    eager_only("one_hot", tc.one_hot, [np.array([[1, 4], [0, 2]])], lambda t: _one_hot(t, 5), I64,
               "num_classes=-1: the largest class + 1")
    # The random draws (p in (0, 1), training) are tested in tests/library/test_dropout.py.
    sample("dropout", lambda x: tc.dropout(x, training=False), [arr((3, 4))], lambda x: x, F32,
           "training=False: the input")
    sample("dropout", lambda x: tc.dropout(x, p=0.0), [arr((2, 3), F64)], lambda x: x, F64, "p=0: the input")
    sample("dropout", lambda x: tc.dropout(x, 1.0), [arr((5,), F64)], lambda x: 0 * x, F64, "p=1: zeros")


_norm_layer_samples()


def all_samples() -> list[Sample]:
    return [s for ss in SAMPLES.values() for s in ss]
