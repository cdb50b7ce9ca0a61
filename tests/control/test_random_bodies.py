"""Hypothesis draws scan bodies from the shared op-sample table and checks tc.scan against
the same loop unrolled in Python: values and gradients (of init, xs and a closed-over weight).

A body is c' = tanh(a(c) * w + b(x)), y = d(c') with a, b, d drawn from the table's unary
float ops whose samples cover the whole real line (so any carry is in their domain);
the tanh keeps the carry bounded over the steps.  Traced programs run on the reference
interpreter, whose kernels are the eager ones: the two agree to rounding.
"""
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracecomp as tc
from tables.op_samples import FLOATS, UNARY, arr

SMOOTH = sorted(name for name, (ref, domain, rule, dtypes, _) in UNARY.items()
                if domain is arr and rule == "float" and set(FLOATS) <= set(dtypes)
                and name not in ("exp", "exp2", "expm1", "sinh", "cosh",     # steep: 1e-9 means little there
                                 "digamma", "lgamma"))                     # poles at 0, -1, -2, ...
EXAMPLES = 200 if os.environ.get("TRACECOMP_SLOW") else 25


def _program(a, b, d, reverse):
    fa, fb, fd = (getattr(tc, n) for n in (a, b, d))

    def body(w):
        return lambda c, x: (tc.tanh(fa(c) * w + fb(x)), fd(c))

    def scanned(init, xs, w):
        c, ys = tc.scan(body(w), init, xs, reverse=reverse)
        return (c * c).sum() + (ys * ys).sum() * 0.5

    def unrolled(init, xs, w):
        f, c, ys = body(w), init, [None] * xs.shape[0]
        for i in (range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])):
            c, ys[i] = f(c, xs[i])
        ys = tc.stack(ys, 0)
        return (c * c).sum() + (ys * ys).sum() * 0.5
    return scanned, unrolled


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.sampled_from(SMOOTH), b=st.sampled_from(SMOOTH), d=st.sampled_from(SMOOTH),
       length=st.integers(1, 7), width=st.integers(1, 4), reverse=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_scan_of_a_random_body_equals_the_unrolled_loop(a, b, d, length, width, reverse, seed):
    rng = np.random.default_rng(seed)
    init, xs, w = (tc.tensor(rng.uniform(-2, 2, s)) for s in ((width,), (length, width), (width,)))
    scanned, unrolled = _program(a, b, d, reverse)
    np.testing.assert_allclose(tc.trace(scanned, backend="interp")(init, xs, w).numpy(),
                               unrolled(init, xs, w).numpy(), rtol=1e-9, atol=1e-12)
    want = tc.grad(unrolled, argnums=(0, 1, 2))(init, xs, w)
    got = tc.trace(tc.grad(scanned, argnums=(0, 1, 2)), backend="interp")(init, xs, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-8, atol=1e-10)
