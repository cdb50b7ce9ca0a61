"""Gradients in bfloat16 and float16, from the gradcheck samples of test_gradcheck_ops.py:
the inputs rounded to the half dtype, the gradient of sum(outputs * fixed cotangents)
eagerly (backward) and compiled (tc.trace of tc.grad), against the float64 gradient on the
same rounded inputs.  The tolerance is PyTorch's for the dtype (rtol 1.6e-2 for bfloat16,
1e-3 for float16), with atol that rtol times the larger of 1 and the largest reference
gradient: the samples' values and cotangents are of order one, and a backward pass rounds
the order-one values it reads (1 - tanh(x)^2 from a rounded tanh, a normalized input), so
an entry that cancels to near zero keeps the error of those terms.  Gradients have their
input's dtype, as in PyTorch; an input no gradient reaches gets none.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tracecomp as tc

from test_gradcheck_ops import FIRST

# Samples whose inputs cannot all be rounded to the half dtype, each with why.
NOT_IN_HALF = {"_scaled_dot_product_flash_attention_for_cpu_backward":
               "its logsumexp input stays float32 for half queries, as in PyTorch"}
HALF = {"bfloat16": (tc.bfloat16, ml_dtypes.bfloat16, 1.6e-2), "float16": (tc.float16, np.float16, 1e-3)}


def _loss(fn, cotangents):
    def loss(*xs):
        outs = fn(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum((o.to(c.dtype) * c).sum() for o, c in zip(outs, cotangents))
    return loss


def _cotangents(fn, inputs, dtype) -> list:
    outs = fn(*[tc.tensor(x) for x in inputs])
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.default_rng(7)
    return [tc.tensor(rng.uniform(0.5, 1.5, o.shape).astype(dtype)) for o in outs]


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("s, prepared", FIRST)
def test_half_gradients_match_float64(s, prepared, dtype):
    if s.op in NOT_IN_HALF:
        pytest.skip(NOT_IN_HALF[s.op])
    d, np_type, rtol = HALF[dtype]
    fn, inputs = prepared
    with np.errstate(over="ignore"):
        halves = [x.astype(np.float32).astype(np_type) for x in inputs]
    if not all(np.isfinite(h.astype(np.float32)).all() for h in halves):
        pytest.skip(f"an input overflows {dtype}")
    wide = [h.astype(np.float64) for h in halves]
    want = tc.grad(_loss(fn, _cotangents(fn, wide, np.float64)), argnums=tuple(range(len(wide))))(*wide)
    loss = _loss(fn, _cotangents(fn, wide, np.float32))
    leaves = [tc.tensor(h, requires_grad=True) for h in halves]
    value = loss(*leaves)
    if not value.requires_grad:
        pytest.skip("no gradient reaches the inputs")
    value.backward()
    compiled = tc.trace(tc.grad(loss, argnums=tuple(range(len(halves)))))(*halves)
    for i, w in enumerate(np.asarray(w, np.float64) for w in want):
        atol = rtol * max(float(np.max(np.abs(w), initial=0.0)), 1.0)
        eager = leaves[i].grad if leaves[i].grad is not None else tc.zeros(halves[i].shape, dtype=d)
        for label, g in (("eager", eager), ("compiled", compiled[i])):
            assert g.dtype is d, f"{s.id} ({label}): gradient {i} is {g.dtype}"
            np.testing.assert_allclose(np.asarray(g).astype(np.float64), w, rtol=rtol, atol=atol,
                                       err_msg=f"{s.id} ({label}) gradient {i}")


@pytest.mark.parametrize("method", ["half", "bfloat16"])
def test_a_cast_to_half_passes_the_gradient_back_rounded(method):
    """x.half() / x.bfloat16(): the cotangent, rounded to the half dtype on its way back
    (as in PyTorch), eagerly and compiled."""
    import torch
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    c = np.linspace(0.1, 1.3, 12, dtype=np.float32) / 3

    def loss(x):
        return (getattr(x, method)().to(tc.float32) * tc.tensor(c)).sum()
    want = torch.tensor(x, requires_grad=True)
    (getattr(want, method)().float() * torch.tensor(c)).sum().backward()
    xt = tc.tensor(x, requires_grad=True)
    loss(xt).backward()
    np.testing.assert_array_equal(np.asarray(xt.grad), want.grad.numpy())
    np.testing.assert_array_equal(np.asarray(tc.trace(tc.grad(loss))(x)), want.grad.numpy())


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_activation_gradients_round_once_like_torch(name):
    """gelu's and silu's gradients of bfloat16 tensors compute in float32 and round once,
    as PyTorch's kernels do: within one bfloat16 ulp of torch's, eagerly and compiled."""
    torch = pytest.importorskip("torch")
    x = np.linspace(-4, 4, 4097).astype(ml_dtypes.bfloat16)
    g = np.random.default_rng(8).uniform(0.5, 1.5, x.shape).astype(ml_dtypes.bfloat16)
    fns = {"gelu": (tc.nn.functional.gelu, torch.nn.functional.gelu),
           "gelu_tanh": (lambda v: tc.nn.functional.gelu(v, approximate="tanh"),
                         lambda v: torch.nn.functional.gelu(v, approximate="tanh")),
           "silu": (tc.nn.functional.silu, torch.nn.functional.silu)}
    ours, theirs = fns[name]
    tx = torch.from_numpy(x.astype(np.float32)).bfloat16().requires_grad_()
    theirs(tx).backward(torch.from_numpy(g.astype(np.float32)).bfloat16())
    want = tx.grad.float().numpy().astype(np.float64)
    vjp = lambda a, b: tc.grad(lambda v: (ours(v) * b).to(tc.float32).sum())(a)      # noqa: E731
    ulp = np.spacing(np.abs(want).astype(ml_dtypes.bfloat16)).astype(np.float64)
    for got in (vjp(tc.tensor(x), tc.tensor(g)), tc.trace(vjp)(x, g)):
        assert got.dtype == tc.bfloat16
        err = np.abs(np.asarray(got).astype(np.float64) - want)
        assert np.all(err <= ulp), err.max()
