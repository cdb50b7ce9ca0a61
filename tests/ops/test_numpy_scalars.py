"""NumPy scalars are data under tc.trace (0-d tensors, as in JAX); Python numbers are
static (as in torch.compile); a retrace warning says what changed, not every signature."""
from __future__ import annotations


import numpy as np
import pytest

import tracecomp as tc


def _adam(w, g, m, v, lr, b1, b2, t):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    return w - lr * m_hat / (tc.sqrt(v_hat) + 1e-8), m, v


def test_adam_with_numpy_scalar_hyperparameters_compiles_once():
    """The bias corrections change every step (t = 1, 2, ...): as NumPy scalars they are
    inputs, so 50 steps run one compiled program, and match NumPy."""
    rng = np.random.default_rng(0)
    step = tc.trace(_adam)
    w = wn = rng.standard_normal(5).astype(np.float32)
    m = v = mn = vn = np.zeros(5, np.float32)
    for t in range(1, 51):
        g = rng.standard_normal(5).astype(np.float32)
        args = (np.float32(1e-2), np.float32(0.9), np.float32(0.999), np.float32(t))
        w, m, v = (x.numpy() for x in step(w, g, m, v, *args))
        mn = 0.9 * mn + 0.1 * g
        vn = 0.999 * vn + 0.001 * g * g
        wn = wn - 1e-2 * (mn / (1 - 0.9 ** t)) / (np.sqrt(vn / (1 - 0.999 ** t)) + 1e-8)
    assert len(step._history) == 1
    np.testing.assert_allclose(w, wn, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("scalar, dtype", [(np.float32(0.5), tc.float32), (np.float64(0.5), tc.float64),
                                           (np.int64(3), tc.int64), (np.bool_(True), tc.bool),
                                           (np.array(2.0, np.float32), tc.float32)])
def test_numpy_scalars_arrive_as_0d_tensors(scalar, dtype):
    seen = []

    def f(s):
        seen.append(s)
        return s * 1
    out = tc.trace(f)(scalar)
    assert isinstance(seen[0], tc.Tensor) and seen[0].ndim == 0 and seen[0].dtype == dtype
    assert out.dtype == (tc.int64 if dtype == tc.bool else dtype)


def test_a_numpy_float64_scalar_does_not_widen_a_float32_tensor():
    """A 0-d tensor promotes like a scalar of its category (PyTorch's rule)."""
    out = tc.trace(lambda x, s: x * s)(np.ones(3, np.float32), np.float64(0.5))
    assert out.dtype == tc.float32


def test_python_numbers_stay_static():
    f = tc.trace(lambda x, k: x * k)
    for k in (1.0, 2.0, 3.0):
        f(np.ones(2), k)
    assert len(f._history) == 3


def test_retrace_warning_lists_what_changed():
    f = tc.trace(lambda x, *params: x + sum(params), max_retraces=2)
    params = [float(i) for i in range(20)]
    with pytest.warns(UserWarning) as record:
        for k in range(4):
            f(np.ones(2), *params[:19], float(k))
    text = str(record[0].message)
    assert "args[20] changed from 0.0 to 1.0" in text and "args[20] changed from 1.0 to 2.0" in text
    assert text.count("args[5]") == 1         # the unchanged arguments appear once, in the first signature
