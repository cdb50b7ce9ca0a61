"""Every differentiable op against finite differences, from the shared sample table
(tests/tables/op_samples.py): gradcheck eagerly and through tc.trace (symbolic backward graphs),
tc.jvp (forward-mode `result:` formulas) against central differences, and gradgradcheck
(second derivatives: formulas differentiated again) on every differentiable op plus a
representative set of compositions.

Samples are used in float64 (their floating inputs are widened; samples with no floating
input, with non-finite values, or with a non-float64 floating result are skipped), and
only where the function is smooth: a few samples sit on a kink on purpose (ties, values at
rounding steps), see KINKS.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.autograd.derivatives import default_derivatives
from tracecomp.ops.table import default_table

from tables.op_samples import EAGER_ONLY, SAMPLES, Sample, leaves
from tables.sweeps import sweep

TABLE = default_table()
DERIVATIVES = default_derivatives()
EPS = 1e-6


# Composites without a gradient, as in PyTorch (their results are new tensors).
NOT_DIFFERENTIABLE = {"unique"}


def differentiable(name: str) -> bool:
    op = TABLE[name]
    if name in NOT_DIFFERENTIABLE:
        return False
    if not op.schema.tensor_arguments:
        return False                                   # factories
    if op.kind == "composite":
        return True
    if op.kind == "region":
        return False          # rules over their regions (control/autodiff.py): tests/control
    d = DERIVATIVES[name]
    return any(f.expr is not None for f in d.formulas)


# Samples that sit on a kink of a piecewise function on purpose; finite differences there
# straddle the kink and disagree with the (one-sided / averaged) subgradient.
KINKS = {
    ("round", "tc.round(float32)"),         # -2.5, -1.5, ...: rounding steps
    ("round", "tc.round(float64)"),
    ("round", "x.round() float32"),
    ("round", "0-d float64"),               # 2.5
    ("round.decimals", "decimals=0 ties to even"),
    ("atan2", "axes"),                      # atan2(+-0, -1): the branch cut
    ("binary_cross_entropy", "log clamped at -100"),     # x = 0 and 1, where log is -inf
    ("topk", "smallest, dim 0, ties"),      # which of two equal values is picked jumps
    ("kthvalue", "keepdim, ties"),
    ("erfinv", "near +-1 and near 0"),      # slope 1e7 at 1 - 1e-13: differences of 1e-6 leave the domain
    ("adaptive_max_pool2d", "ties: the first in row-major order"),    # all equal: which one is the max jumps
}

# Samples whose gradient is, on purpose and as in PyTorch, not the derivative of the result.
NOT_THE_DERIVATIVE = {
    ("embedding", "padding_idx: its rows are read"): "the row padding_idx gets no gradient, though the result "
                                                     "reads it (tests/nn/test_norm_layers.py compares with torch)",
}

# Smooth samples for ops whose shared samples all sit on kinks.
EXTRA = [Sample("round", tc.round, (np.array([0.3, -1.2, 2.7, -3.9]),), None, "float64", "away from .5")]

# Ops that have a gradient but no float64 -> float64 sample to check it on.
NOT_CHECKED = {
    "float": "float32 result (finite differences need float64)",
    "half": "float16 result (finite differences need float64; test_half_grads.py checks casts to it)",
    "bfloat16": "bfloat16 result (finite differences need float64; test_half_grads.py checks casts to it)",
    "int": "int32 result: no gradient flows", "long": "int64 result: no gradient flows",
    "bool": "bool result: no gradient flows",
    "count_nonzero": "int64 result: no gradient flows",
    "one_hot": "int64 classes in, int64 result: no gradient flows",
    **{name: "integer positions: no gradient flows" for name in (
        "argsort.stable", "searchsorted.Scalar", "bucketize.Tensor", "bucketize.Scalar", "nonzero", "argwhere",
        "nonzero_static")},
}


def _widen(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def _float_outputs(out) -> list:
    return [o for o in leaves(out) if o.dtype.is_floating_point]


def _prepare(s: Sample):
    """(fn over the floating inputs, floating inputs, other inputs by position) or a skip reason."""
    if not differentiable(s.op):
        return None, "not differentiable"
    inputs = [_widen(a) for a in s.inputs]
    floats = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"]
    if not floats:
        return None, "no floating input"
    if any(not np.all(np.isfinite(inputs[i])) for i in floats):
        return None, "non-finite input"
    if (s.op, s.desc) in KINKS:
        return None, "sits on a kink"
    if (s.op, s.desc) in NOT_THE_DERIVATIVE:
        return None, NOT_THE_DERIVATIVE[(s.op, s.desc)]
    try:
        outs = _float_outputs(s.call(*[tc.tensor(a) for a in inputs]))
    except tc.TracecompError:
        return None, "an error case"
    if not outs or any(o.dtype is not tc.float64 for o in outs):
        return None, "result is not float64"
    if any(not np.all(np.isfinite(np.asarray(o))) for o in outs):
        return None, "non-finite result"

    def fn(*xs):
        full = list(inputs)
        for i, x in zip(floats, xs):
            full[i] = x
        out = s.call(*[x if isinstance(x, tc.Tensor) else tc.tensor(x) for x in full])
        fo = _float_outputs(out)
        return fo[0] if len(fo) == 1 else tuple(fo)
    return (fn, [inputs[i] for i in floats]), None


def _samples(per_op: int | None = None, table: dict = SAMPLES) -> list:
    out = []
    for name, samples in list(table.items()) + ([(s.op, [s]) for s in EXTRA] if table is SAMPLES else []):
        taken = 0
        extra = any(samples[0] is e for e in EXTRA)
        for k, s in enumerate(samples):
            prepared, why = _prepare(s)
            if prepared is None:
                continue
            if per_op is not None and taken >= per_op:
                break
            taken += 1
            out.append(pytest.param(s, prepared, id=f"{name}#{'extra' if extra else k + 1}:{s.desc}"))
    return out


CASES = _samples()
FIRST = _samples(per_op=1)
_FIRST_IDS = {p.id for p in FIRST}
# The traced gradcheck and the jvp check (each sample is also gradchecked eagerly): the
# default run takes each op's first sample, the others are marked slow (TRACECOMP_SLOW=1).
FIRST_BY_DEFAULT = sweep(CASES, lambda p: p.id in _FIRST_IDS)
EAGER_CASES = _samples(table=EAGER_ONLY)          # data-dependent shapes: eager gradcheck only


def test_every_differentiable_op_is_checked():
    """Each op that has a gradient gets at least one gradcheck sample (nothing silently skipped)."""
    checked = {p.values[0].op for p in CASES + EAGER_CASES}
    missing = sorted(n for n in TABLE if differentiable(n) and n not in checked and n not in NOT_CHECKED)
    assert not missing, f"differentiable ops without a usable float sample: {missing}"


@pytest.mark.parametrize("s, prepared", CASES + EAGER_CASES)
def test_gradcheck_eager(s, prepared):
    fn, inputs = prepared
    assert tc.gradcheck(fn, inputs)


@pytest.mark.parametrize("s, prepared", FIRST_BY_DEFAULT)
def test_gradcheck_traced(s, prepared):
    fn, inputs = prepared
    assert tc.gradcheck(fn, inputs, traced=True)


def _flat(out) -> np.ndarray:
    outs = [out] if isinstance(out, tc.Tensor) else list(out)
    return np.concatenate([np.asarray(o, np.float64).reshape(-1) for o in outs]) if outs else np.zeros(0)


@pytest.mark.parametrize("s, prepared", FIRST_BY_DEFAULT)
def test_jvp_matches_finite_differences(s, prepared):
    fn, inputs = prepared
    rng = np.random.default_rng(len(s.desc))
    tangents = [np.asarray(rng.standard_normal(a.shape)) for a in inputs]
    _, tangent_out = tc.jvp(fn, inputs, tangents)
    plus = _flat(fn(*[np.asarray(a + EPS * t) for a, t in zip(inputs, tangents)]))
    minus = _flat(fn(*[np.asarray(a - EPS * t) for a, t in zip(inputs, tangents)]))
    np.testing.assert_allclose(_flat(tangent_out), (plus - minus) / (2 * EPS), rtol=1e-4, atol=1e-6,
                               err_msg=f"{s.id}: jvp vs central differences")


@pytest.mark.parametrize("s, prepared", FIRST)
def test_gradgradcheck_every_op(s, prepared):
    fn, inputs = prepared
    assert tc.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("s, prepared", FIRST)
def test_jvp_traced(s, prepared):
    fn, inputs = prepared
    rng = np.random.default_rng(1)
    tangents = [np.asarray(rng.standard_normal(a.shape)) for a in inputs]
    n = len(inputs)
    _, want = tc.jvp(fn, inputs, tangents)
    _, got = tc.trace(lambda *a: tc.jvp(fn, a[:n], a[n:]))(*inputs, *tangents)
    np.testing.assert_allclose(_flat(got), _flat(want), rtol=1e-12, atol=1e-14, err_msg=s.id)


# ---------------------------------------------------------------- second derivatives

_rng = np.random.default_rng(7)


def _r(*shape, lo=-2.0, hi=2.0):
    return _rng.uniform(lo, hi, shape)


def _distinct(*shape):
    n = int(np.prod(shape))
    return (_rng.permutation(n) - n / 2).reshape(shape) * 0.37


_INDEX = np.array([[0, 2, 1, 2], [1, 1, 0, 3], [3, 0, 0, 1]])

SECOND_ORDER = [
    ("pow tensor ** tensor", lambda a, b: a ** b, [_r(3, 2, lo=0.5, hi=2), _r(3, 2)]),
    ("pow x ** 2.5 and 2 ** x", lambda a: a ** 2.5 + 2 ** a, [_r(4, lo=0.3, hi=2)]),
    ("pow x ** 3 at 0", lambda a: a ** 3, [np.array([0.0, -1.5, 2.0])]),
    ("atan2", tc.atan2, [_r(2, 3), _r(2, 3, lo=0.5)]),
    ("gelu", tc.gelu, [_r(6)]),
    ("gelu tanh", lambda x: tc.gelu(x, approximate="tanh"), [_r(6)]),
    ("silu * erf", lambda x: tc.silu(x) * tc.erf(x), [_r(5)]),
    ("sigmoid tanh exp log", lambda x: tc.sigmoid(x).log() * tc.tanh(x) + tc.exp(-x * x), [_r(5)]),
    ("sqrt rsqrt reciprocal", lambda x: x.sqrt() + x.rsqrt() * x.reciprocal(), [_r(4, lo=0.5, hi=3)]),
    ("div broadcast", lambda a, b: a / b, [_r(3, 1), _r(4, lo=0.5)]),
    ("maximum minimum", lambda a, b: tc.maximum(a, b) * tc.minimum(a, b) ** 2, [_r(5), _r(5)]),
    ("clamp tensor bounds", lambda x, lo, hi: tc.clamp(x, lo, hi) ** 2, [_r(3, 4), _r(4, lo=-1.5, hi=-0.5),
                                                                          _r(3, 1, lo=0.5, hi=1.5)]),
    ("where", lambda x, y: tc.where(x > 0, x * y, y.sin()), [_r(3, 3), _r(3, 3)]),
    ("amax", lambda x: x.amax(1) ** 2, [_distinct(3, 4)]),
    ("amin all dims", lambda x: x.amin() * x.sum(), [_distinct(2, 3)]),
    ("max.dim", lambda x: tc.max(x, 0).values ** 3, [_distinct(3, 2)]),
    ("var", lambda x: x.var(1, correction=0) ** 2, [_r(3, 4)]),
    ("std keepdim", lambda x: x.std((0, 1), keepdim=True) * x, [_r(2, 3)]),
    ("prod with one zero", lambda x: x.prod(1), [np.array([[1.5, 0.0, -2.0], [0.5, 1.2, 3.0]])]),
    ("logsumexp", lambda x: tc.logsumexp(x, 1) ** 2, [_r(3, 4)]),
    ("mean keepdim", lambda x: (x - x.mean(0, keepdim=True)) ** 2, [_r(3, 2)]),
    ("matmul 2-D", lambda a, b: (a @ b) ** 2, [_r(2, 3), _r(3, 2)]),
    ("matmul batched broadcast", lambda a, b: (a @ b) ** 2, [_r(2, 1, 2, 3), _r(3, 3, 2)]),
    ("matmul 1-D @ 3-D", lambda a, b: (a @ b) ** 2, [_r(3), _r(2, 3, 2)]),
    ("matmul 2-D @ 1-D and dot", lambda a, b: (a @ b) ** 2 + (b @ b), [_r(2, 3), _r(3)]),
    ("softmax", lambda x: tc.softmax(x, 1) ** 2, [_r(2, 4)]),
    ("log_softmax", lambda x: tc.log_softmax(x, 0) * x, [_r(3, 2)]),
    ("layer_norm weight bias", lambda x, w, b: tc.layer_norm(x, [4], w, b) ** 2, [_r(2, 4), _r(4), _r(4)]),
    ("cross_entropy", lambda x: tc.cross_entropy(x, tc.tensor(np.array([0, 3, 1]))), [_r(3, 4)]),
    ("mse_loss", lambda a, b: tc.mse_loss(a, b), [_r(2, 3), _r(2, 3)]),
    ("slicing and select", lambda x: x[1:, ::2] ** 2 * x[0, 1], [_r(3, 4)]),
    ("index_select", lambda x: tc.index_select(x, 1, tc.tensor(np.array([2, 0, 2]))) ** 2, [_r(2, 3)]),
    ("gather", lambda x: tc.gather(x, 1, tc.tensor(_INDEX)) ** 2, [_r(3, 4)]),
    ("scatter_add", lambda x, s: tc.scatter_add(x, 1, tc.tensor(_INDEX), s) ** 2, [_r(3, 4), _r(3, 4)]),
    ("index_add", lambda x, s: tc.index_add(x, 0, tc.tensor(np.array([1, 1])), s, alpha=2) ** 2,
     [_r(3, 2), _r(2, 2)]),
    ("cat and split", lambda a, b: [p ** 2 for p in tc.cat([a, b, a], 1).split([1, 3, 1], 1)][1] * 2,
     [_r(2, 2), _r(2, 1)]),
    ("stack and chunk", lambda a, b: tc.stack([a, b]).chunk(2, 1)[1] ** 3, [_r(3), _r(3)]),
    ("views", lambda x: (x.reshape(3, 2).T.unsqueeze(0).expand(2, 2, 3) ** 2).squeeze().sum(0), [_r(2, 3)]),
    ("mlp", lambda w, x: tc.cross_entropy(tc.relu(x @ w) @ w.T, tc.tensor(np.array([1, 0]))),
     [_r(3, 4), _r(2, 3)]),
]


@pytest.mark.parametrize("fn, inputs", [c[1:] for c in SECOND_ORDER], ids=[c[0] for c in SECOND_ORDER])
def test_gradgradcheck_eager(fn, inputs):
    assert tc.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("fn, inputs", [c[1:] for c in SECOND_ORDER], ids=[c[0] for c in SECOND_ORDER])
def test_gradgradcheck_traced(fn, inputs):
    assert tc.gradgradcheck(fn, inputs, traced=True)


@pytest.mark.parametrize("fn, inputs", [c[1:] for c in SECOND_ORDER], ids=[c[0] for c in SECOND_ORDER])
def test_forward_over_reverse_matches_finite_differences(fn, inputs):
    """jvp of the gradient (a Hessian-vector product) against central differences of the gradient."""
    def loss(*xs):
        out = fn(*xs)
        return (out * tc.tensor(np.linspace(0.5, 1.5, out.numel()).reshape(out.shape))).sum()
    argnums = tuple(range(len(inputs)))
    grad = tc.grad(loss, argnums=argnums)
    rng = np.random.default_rng(3)
    tangents = [rng.standard_normal(a.shape) for a in inputs]
    _, hvp = tc.jvp(lambda *xs: grad(*xs), inputs, tangents)
    plus = grad(*[a + EPS * t for a, t in zip(inputs, tangents)])
    minus = grad(*[a - EPS * t for a, t in zip(inputs, tangents)])
    for h, p, m in zip(hvp, plus, minus):
        np.testing.assert_allclose(np.asarray(h), (np.asarray(p) - np.asarray(m)) / (2 * EPS), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("x", [[[0.0, 0.0, 2.0], [1.0, 2.0, 3.0]],      # two zeros in a group
                               [[0.0, 3.0, 2.0], [1.0, 0.0, 0.0]],
                               [[0.0, 0.0, 0.0], [1.0, 0.0, 5.0]]])     # three zeros: second derivative 0
def test_prod_second_derivative_with_zeros(x):
    assert tc.gradgradcheck(lambda x: x.prod(1), [np.array(x)])
    assert tc.gradgradcheck(lambda x: x.prod(), [np.array(x)[:, :2]])
