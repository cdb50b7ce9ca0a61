"""master_weights=True: bfloat16 parameters step through a float32 copy with float32 state,
as torch does it by hand (bf16 params, an fp32 master copy its optimizer steps, the rounded
value written back); eager, functional under tc.trace, state_dict; a small model's loss curve
in bfloat16 with master weights follows its float32 run."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp import optim
from tracecomp.core.errors import ArgumentError

torch = pytest.importorskip("torch")

CASES = {
    "sgd_momentum": (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    "adam": (optim.Adam, torch.optim.Adam, dict(lr=0.01)),
    "adamw": (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}
STEPS = 6


def _grads(rng, shape):
    """A fixed sequence of bfloat16 gradients (both libraries step with the same ones)."""
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(STEPS)]


def _f32(t) -> np.ndarray:
    return t.detach().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t).astype(np.float32)


def _torch_by_hand(tcls, hyper, w0, grads):
    """bf16 parameter, fp32 master the optimizer owns, the rounded master written back."""
    p = torch.tensor(w0).bfloat16()
    master = p.float().requires_grad_()
    opt = tcls([master], **hyper)
    for g in grads:
        master.grad = torch.tensor(g).bfloat16().float()
        opt.step()
        p = master.detach().bfloat16()
    return p, master.detach(), opt


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_step_matches_torch_with_a_master_copy_by_hand(case):
    cls, tcls, hyper = CASES[case]
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    grads = _grads(rng, w0.shape)
    w = tc.tensor(w0).to(tc.bfloat16).requires_grad_()
    opt = cls([w], master_weights=True, **hyper)
    for g in grads:
        w.grad = tc.tensor(g).to(tc.bfloat16)
        opt.step()
    want, want_master, topt = _torch_by_hand(tcls, hyper, w0, grads)
    state = opt.state[w]
    assert w.dtype == tc.bfloat16 and state["master_param"].dtype == tc.float32
    assert all(v.dtype == tc.float32 for k, v in state.items() if k != "step")
    np.testing.assert_allclose(_f32(state["master_param"]), want_master.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_f32(w), _f32(want))
    for k, v in topt.state[next(iter(topt.state))].items():
        if k != "step":
            np.testing.assert_allclose(_f32(state[k]), v.numpy(), rtol=1e-5, atol=1e-7, err_msg=k)


def test_small_updates_accumulate_in_the_master_copy_only():
    """lr * grad under half a bfloat16 ulp of 1.0: lost each step without a master copy."""
    runs = {}
    for master in (False, True):
        w = tc.ones(4, dtype=tc.bfloat16).requires_grad_()
        opt = optim.SGD([w], lr=1e-3, master_weights=master)
        for _ in range(50):
            w.grad = tc.ones(4, dtype=tc.bfloat16)
            opt.step()
        runs[master] = _f32(w)[0]
    assert runs[False] == 1.0
    assert runs[True] == pytest.approx(0.95, abs=4e-3)


def _train_step(opt):
    def step(params, state, x, y):
        def loss_fn(p):
            return ((tc.tanh(x @ p["w1"]) @ p["w2"] - y).float() ** 2).mean()
        loss, grads = tc.value_and_grad(loss_fn)(params)
        params, state = opt.update(grads, state, params)
        return params, state, loss
    return step


def _problem(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = np.sin(x @ rng.standard_normal((8, 2))).astype(np.float32)
    params = {"w1": rng.standard_normal((8, 16)).astype(np.float32) * 0.4,
              "w2": rng.standard_normal((16, 2)).astype(np.float32) * 0.3}
    cast = (lambda a: tc.tensor(a).to(dtype))
    return {k: cast(v) for k, v in params.items()}, cast(x), cast(y)


@pytest.mark.parametrize("backend", ["cpu", "interp"])
@pytest.mark.parametrize("case", ["sgd_momentum", "adamw"])
def test_traced_functional_step_equals_eager_and_follows_float32(case, backend):
    cls, _, hyper = CASES[case]
    curves = {}
    for dtype, master in [(tc.float32, False), (tc.bfloat16, True)]:
        opt = cls(master_weights=master, **hyper)
        params, x, y = _problem(dtype)
        state = opt.init(params)
        step = tc.trace(_train_step(opt), backend=backend)
        losses = []
        for _ in range(40):
            params, state, loss = step(params, state, x, y)
            losses.append(float(loss))
        curves[dtype] = losses
        assert len(step._cache) == 1
        if master:
            assert params["w1"].dtype == tc.bfloat16 and state["master_param"]["w1"].dtype == tc.float32
            assert all(state[k]["w1"].dtype == tc.float32 for k in opt._buffer_names(opt.defaults))
            np.testing.assert_array_equal(_f32(params["w1"]), _f32(state["master_param"]["w1"].to(tc.bfloat16)))
    f32, bf16 = np.array(curves[tc.float32]), np.array(curves[tc.bfloat16])
    assert f32[-1] < 0.5 * f32[0]
    np.testing.assert_allclose(bf16, f32, rtol=0.05, atol=2e-3)


def test_functional_update_equals_eager_step():
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    grads = _grads(rng, w0.shape)
    w = tc.tensor(w0).to(tc.bfloat16).requires_grad_()
    eager = optim.Adam([w], lr=0.01, master_weights=True)
    functional = optim.Adam(lr=0.01, master_weights=True)
    params = {"w": tc.tensor(w0).to(tc.bfloat16)}
    state = functional.init(params)
    update = tc.trace(functional.update)
    for g in grads:
        w.grad = tc.tensor(g).to(tc.bfloat16)
        eager.step()
        params, state = update({"w": w.grad}, state, params)
    np.testing.assert_array_equal(_f32(params["w"]), _f32(w))
    np.testing.assert_allclose(_f32(state["master_param"]["w"]), _f32(eager.state[w]["master_param"]), rtol=1e-6)


def test_state_dict_round_trip_keeps_the_master_copy():
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    grads = _grads(rng, w0.shape)
    ws = [tc.tensor(w0).to(tc.bfloat16).requires_grad_() for _ in range(2)]
    first = optim.AdamW([ws[0]], lr=0.01, master_weights=True)
    for g in grads[:3]:
        ws[0].grad = tc.tensor(g).to(tc.bfloat16)
        first.step()
    saved = first.state_dict()
    assert saved["state"][0]["master_param"].dtype == tc.float32
    ws[1].detach().copy_(ws[0].detach())
    second = optim.AdamW([ws[1]], lr=0.01, master_weights=True)
    second.load_state_dict(saved)
    for g in grads[3:]:
        for w, opt in zip(ws, (first, second)):
            w.grad = tc.tensor(g).to(tc.bfloat16)
            opt.step()
    np.testing.assert_array_equal(_f32(first.state[ws[0]]["master_param"]), _f32(second.state[ws[1]]["master_param"]))
    np.testing.assert_array_equal(_f32(ws[0]), _f32(ws[1]))


def test_float32_parameters_are_stepped_as_without_master_weights():
    w = tc.ones(3, requires_grad=True)
    opt = optim.SGD([w], lr=0.5, master_weights=True)
    w.grad = tc.ones(3)
    opt.step()
    assert "master_param" not in opt.state[w]
    np.testing.assert_array_equal(_f32(w), 0.5)
    with pytest.raises(ArgumentError, match="master_weights must be True or False"):
        optim.Adam([w], master_weights="yes")
    with pytest.raises(ArgumentError, match="has no 'master_param'.*master_weights=True"):
        optim.SGD(lr=0.1, master_weights=True).update({"w": tc.ones(3)}, optim.SGD(lr=0.1).init({"w": tc.ones(3)}),
                                                        {"w": tc.ones(3)})


def test_a_bfloat16_module_trained_eagerly_follows_its_float32_run():
    """Module.bfloat16() after the optimizer is made (it keeps the cast parameters), eager
    steps with master weights: the loss curve stays with the float32 model's."""
    _, x, y = _problem(tc.float32)
    curves = {}
    for dtype in (tc.float32, tc.bfloat16):
        tc.manual_seed(0)
        m = tc.nn.Sequential(tc.nn.Linear(8, 16), tc.nn.Tanh(), tc.nn.Linear(16, 2))
        opt = optim.AdamW(m.parameters(), lr=0.02, master_weights=True)
        m.to(dtype)
        losses = []
        for _ in range(30):
            opt.zero_grad()
            loss = ((m(x.to(dtype)).float() - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        curves[dtype] = np.array(losses)
        assert all(p.dtype == dtype for p in m.parameters())
        assert all(("master_param" in s) == (dtype == tc.bfloat16) for s in opt.state.values())
    assert curves[tc.float32][-1] < 0.5 * curves[tc.float32][0]
    np.testing.assert_allclose(curves[tc.bfloat16], curves[tc.float32], rtol=0.05, atol=2e-3)
