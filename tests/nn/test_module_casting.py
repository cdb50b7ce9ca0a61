"""Module.to(dtype), .bfloat16(), .half(), .float(): parameters and buffers cast in place (the
same objects, so an optimizer made before keeps them), integer buffers untouched, gradients
cast with their parameters; results as torch's module cast the same way."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import ArgumentError

torch = pytest.importorskip("torch")


def _model(lib):
    nn = lib.nn
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 3))


def _same_weights(m, t):
    m.load_state_dict({k: tc.tensor(v.detach().numpy()) for k, v in t.state_dict().items()})


@pytest.mark.parametrize("method,dtype", [("bfloat16", tc.bfloat16), ("half", tc.float16)])
def test_cast_in_place_keeps_objects_and_matches_torch(method, dtype):
    t = _model(torch)
    m = _model(tc)
    _same_weights(m, t)
    params, buffers = list(m.parameters()), dict(m.named_buffers())
    assert getattr(m, method)() is m
    assert [p is q for p, q in zip(params, m.parameters())] == [True] * len(params)
    assert all(p.dtype == dtype and p.requires_grad for p in m.parameters())
    assert buffers["1.running_mean"].dtype == dtype and buffers["1.num_batches_tracked"].dtype == tc.int64
    getattr(t, method)()
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    got, want = m(tc.tensor(x).to(dtype)), t(torch.tensor(x).to(getattr(torch, dtype.label)))
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got).astype(np.float32), want.detach().float().numpy(), rtol=3e-2, atol=3e-2)
    m.float()
    assert all(p.dtype == tc.float32 for p in m.parameters()) and params[0] is next(m.parameters())


def test_an_optimizer_made_before_keeps_the_cast_parameters():
    m = tc.nn.Linear(4, 2)
    opt = tc.optim.SGD(m.parameters(), lr=0.5)
    before = np.asarray(m.weight).copy()
    m.to(tc.bfloat16)
    m(tc.ones(3, 4, dtype=tc.bfloat16)).sum().backward()
    assert m.weight.grad.dtype == tc.bfloat16
    opt.step()
    assert m.weight.dtype == tc.bfloat16
    assert not np.allclose(np.asarray(m.weight).astype(np.float32), before, atol=1e-2)


def test_gradients_follow_their_parameters_and_bad_dtypes_are_refused():
    m = tc.nn.Linear(4, 2)
    m(tc.ones(3, 4)).sum().backward()
    m.to(dtype=tc.bfloat16)
    assert m.weight.grad.dtype == tc.bfloat16 and m.bias.grad.dtype == tc.bfloat16
    m.to("float32")
    assert m.weight.dtype == tc.float32 and m.weight.grad.dtype == tc.float32
    with pytest.raises(ArgumentError, match="Module.to: .*floating dtype.*got int32"):
        m.to(tc.int32)
