"""tc.optim against torch.optim: the same 2-layer MLP, the same initial weights, 20 steps,
eagerly (zero_grad/backward/step) and in one compiled step (value_and_grad + update,
params and state donated) that traces once; state_dict; clear errors."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import tracecomp as tc
import tracecomp.optim as optim
from tracecomp.core.errors import ArgumentError

torch = pytest.importorskip("torch")

STEPS = 20
NAMES = ("w1", "b1", "w2")

# (tracecomp class, torch class name, hyper-parameters): each rule and each option.
CASES = {
    "sgd": (optim.SGD, "SGD", dict(lr=0.1)),
    "sgd_momentum": (optim.SGD, "SGD", dict(lr=0.05, momentum=0.9)),
    "sgd_nesterov_wd": (optim.SGD, "SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "sgd_dampening_maximize": (optim.SGD, "SGD", dict(lr=0.01, momentum=0.8, dampening=0.3, maximize=True)),
    "adam": (optim.Adam, "Adam", dict(lr=0.01)),
    "adam_amsgrad_wd": (optim.Adam, "Adam", dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)),
    "adamw": (optim.AdamW, "AdamW", dict(lr=0.01)),
    "adamw_amsgrad": (optim.AdamW, "AdamW", dict(lr=0.02, weight_decay=0.1, amsgrad=True, eps=1e-6)),
    "rmsprop": (optim.RMSprop, "RMSprop", dict(lr=0.01)),
    "rmsprop_centered_momentum": (optim.RMSprop, "RMSprop",
                                  dict(lr=0.005, alpha=0.9, centered=True, momentum=0.9, weight_decay=0.01)),
    "adagrad": (optim.Adagrad, "Adagrad", dict(lr=0.1)),
    "adagrad_decay": (optim.Adagrad, "Adagrad",
                      dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
}


def _problem():
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((5, 8)).astype(np.float32) * 0.5,
              "b1": rng.standard_normal(8).astype(np.float32) * 0.1,
              "w2": rng.standard_normal((8, 3)).astype(np.float32) * 0.5}
    x = rng.standard_normal((16, 5)).astype(np.float32)
    y = rng.standard_normal((16, 3)).astype(np.float32)
    return params, x, y


def loss_fn(p, x, y):
    return ((tc.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2).mean()


def _torch_loss(p, x, y):
    return ((torch.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2).mean()


@functools.lru_cache(maxsize=None)
def torch_run(case: str, steps: int = STEPS):
    """(losses, final params) of torch.optim on the problem."""
    _, torch_name, hyper = CASES[case]
    init, x, y = _problem()
    p = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    opt = getattr(torch.optim, torch_name)([p[k] for k in NAMES], **hyper)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _torch_loss(p, torch.tensor(x), torch.tensor(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), {k: v.detach().numpy().copy() for k, v in p.items()}


def _assert_matches_torch(case, losses, params):
    torch_losses, torch_params = torch_run(case)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5, atol=1e-6)
    for k in NAMES:
        np.testing.assert_allclose(np.asarray(params[k]), torch_params[k], rtol=1e-5, atol=1e-6, err_msg=k)


def _eager_run(case, steps=STEPS):
    cls, _, hyper = CASES[case]
    init, x, y = _problem()
    p = {k: tc.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    opt = cls([p[k] for k in NAMES], **hyper)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(p, tc.tensor(x), tc.tensor(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, p, opt


@pytest.mark.parametrize("case", CASES)
def test_eager_steps_match_torch(case):
    losses, params, _ = _eager_run(case)
    _assert_matches_torch(case, losses, {k: v.numpy() for k, v in params.items()})
    assert all(params[k].requires_grad and params[k].is_leaf for k in NAMES)


def _train_step(opt):
    def step(params, state, x, y):
        loss, grads = tc.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(grads, state, params)
        return params, state, loss
    return step


@pytest.mark.parametrize("case", CASES)
def test_compiled_step_with_donation_matches_torch_and_traces_once(case):
    cls, _, hyper = CASES[case]
    opt = cls(**hyper)
    init, x, y = _problem()
    step = tc.trace(_train_step(opt), donate_argnums=(0, 1))
    params = {k: v.copy() for k, v in init.items()}
    state = opt.init(params)
    losses = []
    for _ in range(STEPS):
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
    assert len(step._cache) == 1
    assert float(state["step"]) == STEPS
    _assert_matches_torch(case, losses, params)


def test_donated_step_writes_params_and_state_in_place():
    """The update reuses the memory of the donated params and moments."""
    opt = optim.Adam(lr=0.01)
    init, x, y = _problem()
    step = tc.trace(_train_step(opt), donate_argnums=(0, 1))
    params = {k: v.copy() for k, v in init.items()}
    state = opt.init(params)
    params, state, _ = step(params, state, x, y)
    lowered, = step._cache.values()
    assert len(lowered.reused_inputs) >= 3 * len(NAMES)     # params, exp_avg, exp_avg_sq


@pytest.mark.parametrize("case", ["sgd_dampening_maximize", "adamw_amsgrad", "rmsprop_centered_momentum"])
def test_eager_step_and_functional_update_agree(case):
    """One optimizer object: step() and update() run the same rule, to the bit."""
    cls, _, hyper = CASES[case]
    init, x, y = _problem()
    p = {k: tc.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    opt = cls([p[k] for k in NAMES], **hyper)
    params = {k: v.copy() for k, v in init.items()}
    state = opt.init(params)
    for _ in range(5):
        opt.zero_grad()
        loss_fn(p, tc.tensor(x), tc.tensor(y)).backward()
        opt.step()
        _, grads = tc.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(grads, state, params)
    for k in NAMES:
        np.testing.assert_array_equal(p[k].numpy(), params[k].numpy())


def test_update_takes_any_pytree_and_an_lr_argument():
    opt = optim.SGD(lr=1.0)
    params = [np.ones(2, np.float32), (np.ones((), np.float32),)]
    grads = [np.full(2, 2.0, np.float32), (np.full((), 3.0, np.float32),)]
    state = opt.init(params)
    new, state = opt.update(grads, state, params, lr=np.float64(0.5))
    np.testing.assert_allclose(new[0].numpy(), [0.0, 0.0])
    np.testing.assert_allclose(new[1][0].numpy(), -0.5)
    assert float(state["lr"]) == 0.5 and isinstance(new, list) and isinstance(new[1], tuple)


# ---------------------------------------------------------------------- param groups, state_dict

def test_param_groups_have_their_own_hyper_parameters_and_lr_is_changeable():
    init, x, y = _problem()
    p = {k: tc.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    tp = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    opt = optim.SGD([{"params": [p["w1"], p["b1"]]}, {"params": [p["w2"]], "lr": 0.01, "momentum": 0.5}],
                    lr=0.1, momentum=0.9)
    topt = torch.optim.SGD([{"params": [tp["w1"], tp["b1"]]}, {"params": [tp["w2"]], "lr": 0.01, "momentum": 0.5}],
                           lr=0.1, momentum=0.9)
    for i in range(6):
        if i == 3:
            opt.param_groups[0]["lr"] = topt.param_groups[0]["lr"] = 0.03
        for o, loss in ((opt, lambda: loss_fn(p, tc.tensor(x), tc.tensor(y))),
                        (topt, lambda: _torch_loss(tp, torch.tensor(x), torch.tensor(y)))):
            o.zero_grad()
            loss().backward()
            o.step()
    for k in NAMES:
        np.testing.assert_allclose(p[k].numpy(), tp[k].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_step_with_a_closure_and_extra_group_keys():
    w = tc.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = optim.Adam([{"params": [w], "name": "encoder"}], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss
    assert float(opt.step(closure)) == 3.0
    np.testing.assert_allclose(w.numpy(), np.full(3, 0.9), rtol=1e-6)
    assert opt.param_groups[0]["name"] == "encoder" and "name" in opt.state_dict()["param_groups"][0]


def test_zero_grad_set_to_none_or_zeros():
    w = tc.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    (w * w).sum().backward()
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros(3))
    opt.zero_grad()
    assert w.grad is None
    opt.step()                              # no grad: nothing moves
    np.testing.assert_array_equal(w.numpy(), np.ones(3))


def test_state_dict_layout_and_resuming_matches_an_uninterrupted_run():
    case = "adam_amsgrad_wd"
    _, p_a, opt_a = _eager_run(case, steps=8)
    sd = opt_a.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2] and sd["param_groups"][0]["params"] == [0, 1, 2]
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    assert sd["param_groups"][0]["betas"] == (0.8, 0.99)

    # 8 steps, save, a fresh optimizer loads it, 12 more steps: as 20 in one go (and torch's)
    cls, _, hyper = CASES[case]
    _, x, y = _problem()
    p_b = {k: tc.tensor(v.numpy().copy(), requires_grad=True) for k, v in p_a.items()}
    opt_b = cls([p_b[k] for k in NAMES], **hyper)
    opt_b.load_state_dict(sd)
    losses = []
    for _ in range(STEPS - 8):
        opt_b.zero_grad()
        loss = loss_fn(p_b, tc.tensor(x), tc.tensor(y))
        loss.backward()
        opt_b.step()
        losses.append(loss.item())
    np.testing.assert_allclose(losses, torch_run(case)[0][8:], rtol=1e-5, atol=1e-6)
    _assert_matches_torch(case, torch_run(case)[0], {k: v.numpy() for k, v in p_b.items()})


def test_loads_a_torch_state_dict():
    """torch.optim's state dict (torch tensors, the same layout) continues here."""
    case = "rmsprop_centered_momentum"
    cls, torch_name, hyper = CASES[case]
    init, x, y = _problem()
    tp = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    topt = getattr(torch.optim, torch_name)([tp[k] for k in NAMES], **hyper)
    for _ in range(8):
        topt.zero_grad()
        _torch_loss(tp, torch.tensor(x), torch.tensor(y)).backward()
        topt.step()
    p = {k: tc.tensor(v.detach().numpy().copy(), requires_grad=True) for k, v in tp.items()}
    opt = cls([p[k] for k in NAMES], **hyper)
    opt.load_state_dict(topt.state_dict())
    for _ in range(STEPS - 8):
        opt.zero_grad()
        loss_fn(p, tc.tensor(x), tc.tensor(y)).backward()
        opt.step()
    _assert_matches_torch(case, torch_run(case)[0], {k: v.numpy() for k, v in p.items()})


# ---------------------------------------------------------------------- errors

def _leaf(*shape):
    return tc.tensor(np.ones(shape, np.float32), requires_grad=True)


@pytest.mark.parametrize("make, words", [
    (lambda: optim.SGD([tc.tensor(np.ones(2, np.float32))], lr=0.1), ["params'][0]", "does not require grad"]),
    (lambda: optim.Adam([_leaf(2) * 2]), ["params'][0]", "not a leaf"]),
    (lambda: optim.SGD([np.ones(2, np.float32)]), ["params'][0]", "ndarray"]),
    (lambda: optim.SGD([_leaf(2)], lr=-0.1), ["SGD", "lr", "-0.1", ">= 0"]),
    (lambda: optim.Adam([_leaf(2)], betas=(1.0, 0.999)), ["Adam", "beta parameter at index 0", "[0, 1)"]),
    (lambda: optim.AdamW([_leaf(2)], betas=(0.9, -0.1)), ["AdamW", "beta parameter at index 1"]),
    (lambda: optim.RMSprop([_leaf(2)], alpha=-1.0), ["RMSprop", "alpha"]),
    (lambda: optim.Adagrad([_leaf(2)], lr_decay=-1.0), ["Adagrad", "lr_decay"]),
    (lambda: optim.SGD([_leaf(2)], lr=0.1, nesterov=True), ["nesterov", "momentum"]),
    (lambda: optim.SGD([{"params": [_leaf(2)], "lr": -1.0}], lr=0.1), ["param_groups[0]", "lr"]),
    (lambda: optim.SGD([{"params": [_leaf(2)], "betas": (0.9, 0.9)}]), ["param_groups[0]", "'betas'", "does not take"]),
    (lambda: optim.SGD((lambda w: [w, w])(_leaf(2))), ["params'][1]", "more than once"]),
    (lambda: optim.SGD([]), ["empty"]),
    (lambda: optim.SGD(_leaf(2)), ["iterable"]),
    (lambda: optim.SGD({"w": _leaf(2)}), ["dict without a 'params' entry"]),
])
def test_bad_params_and_hyper_parameters_raise_argument_errors(make, words):
    with pytest.raises(ArgumentError) as info:
        make()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def _stepped_adam(*shapes):
    ws = [_leaf(*s) for s in shapes]
    opt = optim.Adam(ws, lr=0.1)
    sum((w * w).sum() for w in ws).backward()
    opt.step()
    return opt


@pytest.mark.parametrize("edit, words", [
    (lambda sd: sd["param_groups"].append(dict(sd["param_groups"][0])), ["2 param group(s)", "has 1"]),
    (lambda sd: sd["param_groups"][0]["params"].pop(), ["param_groups[0]", "1 parameter(s)", "2 in the optimizer"]),
    (lambda sd: sd["state"][1].pop("exp_avg_sq"), ["state[1]", "'exp_avg_sq'"]),
    (lambda sd: sd["state"][0].update(exp_avg=tc.zeros(5)), ["state[0]['exp_avg']", "(5,)", "(2,)"]),
    (lambda sd: sd["state"].update({7: {}}), ["state[7]", "no parameter"]),
    (lambda sd: sd.pop("state"), ["'state'", "'param_groups'"]),
])
def test_a_state_dict_that_does_not_fit_raises_and_names_where(edit, words):
    sd = _stepped_adam((2,), (3,)).state_dict()
    edit(sd)
    fresh = optim.Adam([_leaf(2), _leaf(3)], lr=0.1)
    with pytest.raises(ArgumentError) as info:
        fresh.load_state_dict(sd)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert fresh.state == {}                  # nothing half-loaded


def test_functional_update_errors():
    opt = optim.Adam(lr=0.1)
    params = {"w": np.ones(2, np.float32)}
    state = opt.init(params)
    with pytest.raises(ArgumentError, match="different pytrees"):
        opt.update({"w": np.ones(2, np.float32), "v": np.ones(2, np.float32)}, state, params)
    with pytest.raises(ArgumentError, match="exp_avg_sq"):
        opt.update(params, {"step": state["step"], "lr": state["lr"], "exp_avg": state["exp_avg"]}, params)
    with pytest.raises(ArgumentError, match="holds no tensors"):
        opt.init({})


# ---------------------------------------------------------------------- gradient clipping

import tracecomp.nn.utils as nn_utils  # noqa: E402


def _grads_pair(scale):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s).astype(np.float32) * scale for s in ((3, 4), (5,), ())]
    ours = [tc.tensor(a.copy(), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in arrays]
    for p, t in zip(ours, theirs):
        p.grad = tc.tensor(p.numpy() * 1.5 - 0.25)
        t.grad = torch.tensor(p.grad.numpy().copy())
    return ours, theirs


@pytest.mark.parametrize("max_norm, norm_type", [(1.0, 2.0), (100.0, 2.0), (0.5, 1.0), (0.3, float("inf")),
                                                 (2.0, 3.0)])
def test_clip_grad_norm_matches_torch(max_norm, norm_type):
    ours, theirs = _grads_pair(1.0)
    total = nn_utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    torch_total = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type)
    np.testing.assert_allclose(float(total), float(torch_total), rtol=1e-6)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_functional_clip_grad_norm_in_a_compiled_step_matches_torch():
    ours, theirs = _grads_pair(1.0)
    grads = {"a": ours[0].grad.numpy(), "rest": [ours[1].grad.numpy(), ours[2].grad.numpy()]}
    clip = tc.trace(lambda g: nn_utils.clip_grad_norm(g, 0.7))
    clipped = clip(grads)
    torch.nn.utils.clip_grad_norm_(theirs, 0.7)
    got = [clipped["a"], *clipped["rest"]]
    for g, t in zip(got, theirs):
        np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_clip_grad_value_and_the_nonfinite_check():
    ours, theirs = _grads_pair(1.0)
    nn_utils.clip_grad_value_(ours, 0.4)
    torch.nn.utils.clip_grad_value_(theirs, 0.4)
    for p, t in zip(ours, theirs):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())
    ours[0].grad = tc.tensor(np.array([[np.inf, 1.0]], np.float32))
    with pytest.raises(RuntimeError, match="error_if_nonfinite"):
        nn_utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    assert float(nn_utils.clip_grad_norm_([_leaf(2)], 1.0)) == 0.0     # no grads: norm 0


def test_eager_step_inside_a_trace_points_to_update():
    w = _leaf(2)
    opt = optim.SGD([w], lr=0.1)

    def step(x):
        (w * x).sum().backward()
        opt.step()
    with pytest.raises(tc.TracecompError, match=r"opt.update\(grads, state, params\)"):
        tc.trace(step)(np.ones(2, np.float32))
    assert not w.is_traced and opt.state == {}


def test_float64_params_keep_float64_precision():
    """The scalar arithmetic is float64 and cast to the parameter's dtype: float64 params
    follow torch's float64 run to ~1e-12."""
    rng = np.random.default_rng(3)
    w0, x = rng.standard_normal((4, 3)), rng.standard_normal((6, 4))
    w, tw = tc.tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
    opt, topt = optim.AdamW([w], lr=0.05, amsgrad=True), torch.optim.AdamW([tw], lr=0.05, amsgrad=True)
    for _ in range(10):
        opt.zero_grad()
        (tc.tanh(tc.tensor(x) @ w) ** 2).mean().backward()
        opt.step()
        topt.zero_grad()
        (torch.tanh(torch.tensor(x) @ tw) ** 2).mean().backward()
        topt.step()
    assert w.dtype == tc.float64 and opt.state[w]["exp_avg"].dtype == tc.float64
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-12, atol=1e-14)
