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


def _half_vjp(ours, x, g):
    vjp = lambda a, b: tc.grad(lambda v: (ours(v) * b).to(tc.float32).sum())(a)      # noqa: E731
    return [vjp(tc.tensor(x), tc.tensor(g)), tc.trace(vjp)(x, g)]


def _within_an_ulp(gots, want):
    ulp = np.spacing(np.abs(want).astype(ml_dtypes.bfloat16)).astype(np.float64)
    for got in gots:
        assert got.dtype == tc.bfloat16
        err = np.abs(np.asarray(got).astype(np.float64) - want)
        assert np.all(err <= ulp), err.max()


# (ours, torch's, sample values): torch's CPU backward kernel computes these in float32 from
# the half tensors it saved and rounds once (tanh's from its rounded result)
KERNEL_ROUNDED = {
    # inside (-3, 3): at x = +-3 exactly torch's bfloat16 kernel takes the outer branches
    "hardswish": (tc.nn.functional.hardswish, "hardswish", (-2.95, 2.95)),
    "tanh": (tc.tanh, "tanh", (-3, 3)),
}
# ... and these, whose PyTorch backward rounds each step in the half dtype, as torch's float32
# backward on the same values rounded once (the truth to a bfloat16 ulp)
FLOAT32_ROUNDED = {
    "asin": (tc.asin, "asin", (-0.99, 0.99)), "atanh": (tc.atanh, "atanh", (-0.99, 0.99)),
    "erfinv": (tc.erfinv, "erfinv", (-0.99, 0.99)), "softsign": (tc.nn.functional.softsign, "softsign", (-4, 4)),
    "prod": (lambda v: tc.prod(v.reshape(-1, 4), 1), "prod", (0.5, 1.5)),
    "logcumsumexp": (lambda v: tc.logcumsumexp(v.reshape(-1, 16), 1), "logcumsumexp", (-20, 20)),
}


def _torch_fn(torch, name):
    if name in ("hardswish", "softsign"):
        return getattr(torch.nn.functional, name)
    if name == "prod":
        return lambda v: torch.prod(v.reshape(-1, 4), 1)
    if name == "logcumsumexp":
        return lambda v: torch.logcumsumexp(v.reshape(-1, 16), 1)
    return getattr(torch, name)


@pytest.mark.parametrize("name", [*KERNEL_ROUNDED, *FLOAT32_ROUNDED])
def test_elementwise_and_reduction_gradients_round_once(name):
    """An elementwise op's derivative formula runs in float32 on bfloat16 tensors and rounds
    once (autograd/backward.py), as do prod's and logcumsumexp's: within one bfloat16 ulp of
    PyTorch's kernel, or of PyTorch's float32 gradient rounded where its own half backward
    rounds each step (asin: 0.014 relative off the float64 truth, ours 3.7e-3)."""
    torch = pytest.importorskip("torch")
    ours, theirs, (lo, hi) = {**KERNEL_ROUNDED, **FLOAT32_ROUNDED}[name]
    theirs = _torch_fn(torch, theirs)
    x = np.linspace(lo, hi, 4096).astype(ml_dtypes.bfloat16)
    n_out = np.asarray(ours(tc.tensor(x))).size
    g = np.random.default_rng(8).uniform(0.5, 1.5, n_out).astype(ml_dtypes.bfloat16)
    g = g.reshape(np.asarray(ours(tc.tensor(x))).shape)
    wide = torch.float32 if name in FLOAT32_ROUNDED else torch.bfloat16
    tx = torch.from_numpy(x.astype(np.float32)).to(wide).requires_grad_()
    theirs(tx).backward(torch.from_numpy(g.astype(np.float32)).to(wide))
    want = tx.grad.bfloat16().float().numpy().astype(np.float64)
    _within_an_ulp(_half_vjp(ours, x, g), want)


def test_batch_norm_with_half_running_stats_rounds_once():
    """batch_norm in evaluation with bfloat16 running statistics: var + eps and rsqrt in
    float32 (opmath leaves the written statistics half), as PyTorch's; rounded in bfloat16
    they were up to 0.09 relative off."""
    rng = np.random.default_rng(3)
    x, w, b = (rng.uniform(-9, 9, s).astype(ml_dtypes.bfloat16) for s in ((3, 2, 3, 4), (2,), (2,)))
    mean, var = np.array([0.5234375, 6.3125], ml_dtypes.bfloat16), np.array([0.46679688, 4.21875], ml_dtypes.bfloat16)
    f32 = [a.astype(np.float32) for a in (x, mean, var, w, b)]
    want = np.asarray(tc.batch_norm(*[tc.tensor(a) for a in f32[:3]], tc.tensor(f32[3]), tc.tensor(f32[4]),
                                    eps=0.5)).astype(ml_dtypes.bfloat16)
    got = tc.batch_norm(tc.tensor(x), tc.tensor(mean), tc.tensor(var), tc.tensor(w), tc.tensor(b), eps=0.5)
    assert got.dtype == tc.bfloat16
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want.astype(np.float32))
