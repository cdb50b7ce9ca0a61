"""PyTorch interop: tc.from_dlpack shares memory; torch tensors go wherever a tensor does;
mixing the two in an operator, or passing one that requires grad, says what to write."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch")


def test_from_dlpack_shares_memory():
    t = torch.arange(4.0)
    x = tc.from_dlpack(t)
    t[0] = 7.0
    assert x.tolist() == [7.0, 1.0, 2.0, 3.0] and x.dtype == tc.float32
    a = np.arange(3)
    y = tc.from_dlpack(a)
    a[1] = 9
    assert y.tolist() == [0, 9, 2] and y.dtype == tc.int64


def test_torch_tensors_go_wherever_a_tensor_does():
    t, x = torch.tensor([0.5, 1.5]), tc.tensor([1.0, 2.0])
    np.testing.assert_allclose(tc.exp(t).numpy(), np.exp([0.5, 1.5]), rtol=1e-6)
    assert tc.add(x, t).tolist() == [1.5, 3.5]
    assert tc.cat([x, t]).shape == (4,)
    assert tc.trace(lambda a, b: a * b)(t, x).tolist() == [0.5, 3.0]


@pytest.mark.parametrize("expr", [lambda x, t: x + t, lambda x, t: t * x, lambda x, t: x @ t])
def test_mixing_in_an_operator_names_both_types(expr):
    with pytest.raises(tc.ArgumentError) as e:
        expr(tc.ones(2), torch.ones(2))
    text = str(e.value)
    assert "tracecomp.Tensor" in text and "torch.Tensor" in text and "tc.from_dlpack" in text
    assert "test_interop.py" in text


def test_a_torch_tensor_that_requires_grad_is_refused_at_the_users_line():
    t = torch.ones(2, requires_grad=True)
    for call in (lambda: tc.trace(lambda a: a * 2)(t), lambda: tc.exp(t)):
        with pytest.raises(tc.ArgumentError, match=r"torch.Tensor that requires grad .*x.detach\(\)") as e:
            call()
        assert "test_interop.py" in str(e.value)
    assert tc.exp(t.detach()).shape == (2,)


def test_a_missing_name_points_at_the_operator_table():
    with pytest.raises(AttributeError, match=r"no attribute 'cholesky_inverse'; PyTorch has torch.cholesky_inverse.*tracecomp ops"):
        tc.cholesky_inverse
    with pytest.raises(AttributeError, match=r"no attribute 'frobnicate'; PyTorch has no torch.frobnicate either"):
        tc.frobnicate
