"""tc.optim.lr_scheduler against torch.optim.lr_scheduler: the lr (and OneCycleLR's
momentum) after each of 30 steps, and a compiled train step driven by a scheduler that
traces once."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
import tracecomp.optim as optim
from tracecomp.core.errors import ArgumentError
from tracecomp.optim import lr_scheduler

torch = pytest.importorskip("torch")

STEPS = 30

# (scheduler name, its arguments, optimizer name, optimizer hyper-parameters)
SCHEDULES = {
    "step": ("StepLR", dict(step_size=7, gamma=0.5), "SGD", dict(lr=0.1)),
    "cosine": ("CosineAnnealingLR", dict(T_max=10, eta_min=0.001), "SGD", dict(lr=0.1)),
    "cosine_past_t_max": ("CosineAnnealingLR", dict(T_max=12), "Adam", dict(lr=0.01)),
    "linear": ("LinearLR", dict(start_factor=0.25, end_factor=0.9, total_iters=12), "SGD", dict(lr=0.1)),
    "linear_default": ("LinearLR", {}, "AdamW", dict(lr=0.01)),
    "onecycle_sgd": ("OneCycleLR", dict(max_lr=0.5, total_steps=STEPS), "SGD", dict(lr=0.1, momentum=0.9)),
    "onecycle_adam_linear_3phase": ("OneCycleLR", dict(max_lr=[0.02, 0.05], total_steps=STEPS + 5,
                                                       anneal_strategy="linear", three_phase=True),
                                    "Adam", dict(lr=0.01)),
    "onecycle_no_momentum": ("OneCycleLR", dict(max_lr=0.1, epochs=3, steps_per_epoch=10,
                                                cycle_momentum=False, pct_start=0.4), "Adagrad", dict(lr=0.1)),
}


def _groups(make_leaf, hyper):
    """Two param groups, the second with half the lr, to see both followed."""
    return [{"params": [make_leaf()]}, {"params": [make_leaf()], "lr": hyper["lr"] / 2}]


def _sequence(lib, case):
    sched_name, sched_args, opt_name, hyper = SCHEDULES[case]
    if lib is torch:
        leaf = lambda: torch.zeros(2, requires_grad=True)         # noqa: E731
        opt = getattr(torch.optim, opt_name)(_groups(leaf, hyper), **hyper)
        sched = getattr(torch.optim.lr_scheduler, sched_name)(opt, **sched_args)
    else:
        leaf = lambda: tc.zeros(2).requires_grad_()                # noqa: E731
        opt = getattr(optim, opt_name)(_groups(leaf, hyper), **hyper)
        sched = getattr(lr_scheduler, sched_name)(opt, **sched_args)
    lrs, momenta = [sched.get_last_lr()], []
    for _ in range(STEPS):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr())
        assert [g["lr"] for g in opt.param_groups] == lrs[-1]
        momenta.append([g.get("betas", (g.get("momentum"),))[0] for g in opt.param_groups])
    return np.array(lrs, np.float64), momenta


@pytest.mark.parametrize("case", SCHEDULES)
def test_lr_sequence_matches_torch(case):
    lrs, momenta = _sequence(tc, case)
    torch_lrs, torch_momenta = _sequence(torch, case)
    np.testing.assert_allclose(lrs, torch_lrs, rtol=1e-12, atol=0)
    # None (no momentum) becomes NaN
    np.testing.assert_allclose(np.array(momenta, dtype=float), np.array(torch_momenta, dtype=float), rtol=1e-12)


def test_scheduler_driven_compiled_step_traces_once_and_matches_torch():
    """The lr goes in as a NumPy scalar: data, so 30 steps compile once."""
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((10, 4)).astype(np.float32)

    tw = torch.tensor(w0.copy(), requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1, momentum=0.9)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.3, total_steps=STEPS, cycle_momentum=False)
    for _ in range(STEPS):
        topt.zero_grad()
        (torch.tanh(torch.tensor(x) @ tw) ** 2).mean().backward()
        topt.step()
        tsched.step()

    w = tc.zeros(4, 3).requires_grad_()        # the eager params only carry the param groups here
    opt = optim.SGD([w], lr=0.1, momentum=0.9)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=STEPS, cycle_momentum=False)

    def step(params, state, x, lr):
        grads = tc.grad(lambda p: (tc.tanh(x @ p["w"]) ** 2).mean())(params)
        return opt.update(grads, state, params, lr=lr)
    compiled = tc.trace(step, donate_argnums=(0, 1))
    params = {"w": w0.copy()}
    state = opt.init(params)
    for _ in range(STEPS):
        params, state = compiled(params, state, x, np.float64(sched.get_last_lr()[0]))
        sched.step()
    assert len(compiled._cache) == 1
    np.testing.assert_allclose(params["w"].numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, words", [
    (lambda opt: lr_scheduler.StepLR(opt, step_size=0), ["StepLR", "step_size"]),
    (lambda opt: lr_scheduler.LinearLR(opt, start_factor=0.0), ["start_factor"]),
    (lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1), ["total_steps"]),
    (lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=[0.1, 0.2], total_steps=5), ["max_lr", "2 values"]),
    (lambda opt: lr_scheduler.OneCycleLR(optim.Adagrad([tc.zeros(1).requires_grad_()]), max_lr=0.1,
                                         total_steps=5), ["cycle_momentum", "Adagrad"]),
    (lambda opt: lr_scheduler.StepLR(object(), step_size=2), ["not a tc.optim Optimizer"]),
])
def test_scheduler_errors(make, words):
    opt = optim.SGD([tc.zeros(2).requires_grad_()], lr=0.1, momentum=0.9)
    with pytest.raises(ArgumentError) as info:
        make(opt)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_onecycle_refuses_to_step_past_total_steps():
    opt = optim.SGD([tc.zeros(2).requires_grad_()], lr=0.1, momentum=0.9)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ArgumentError, match="total_steps is 3"):
        sched.step()
