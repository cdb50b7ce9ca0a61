"""A whole tc.nn model as an argument of a traced function (issue 36's cheap call): the
flattened leaves and structure are remembered while no module changes, and every change
that could alter the trace is still seen."""
import numpy as np

import tracecomp as tc
from tracecomp import nn

X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


def _model():
    tc.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))


def _fast_keys(f):
    return [k for k in f._fast if any(getattr(part, "entry", ("",))[0] == "tree" for part in k)]


def test_the_second_call_takes_the_remembered_flattening(monkeypatch):
    model = _model()
    f = tc.trace(lambda m, x: m(x))
    want = model(tc.tensor(X)).detach().numpy()
    np.testing.assert_allclose(f(model, X).numpy(), want, rtol=1e-5, atol=1e-6)
    assert len(_fast_keys(f)) == 1
    from tracecomp.tensors import pytree
    walks = []
    monkeypatch.setattr(pytree, "_walk", lambda *a: walks.append(a) or (_ for _ in ()).throw(AssertionError))
    np.testing.assert_allclose(f(model, X).numpy(), want, rtol=1e-5, atol=1e-6)       # no walk of the model
    assert not walks


def test_changes_to_the_model_are_seen():
    model = _model()
    f = tc.trace(lambda m, x: m(x))
    f(model, X)
    with tc.no_grad():                       # values changed in place: read at every call
        model[0].weight.mul_(2.0)
    np.testing.assert_allclose(f(model, X).numpy(), model(tc.tensor(X)).detach().numpy(), rtol=1e-5, atol=1e-6)
    model[2].weight = nn.Parameter(tc.zeros(2, 5))          # a parameter replaced
    np.testing.assert_allclose(f(model, X).numpy(), np.broadcast_to(model[2].bias.detach().numpy(), (3, 2)),
                               rtol=1e-5, atol=1e-6)
    model.append(nn.ReLU())                  # the structure changed: traced again, and right
    np.testing.assert_array_equal(f(model, X).numpy() >= 0, True)
    traced = len(f._cache)
    model.eval()                             # training is structure
    f(model, X)
    assert len(f._cache) == traced + 1
    model.to(tc.float64)                     # leaves' types changed in place
    assert f(model, X.astype(np.float64)).dtype == tc.float64


def test_under_a_transform_the_model_is_traced_through():
    model = _model()
    f = tc.trace(lambda m, x: m(x).sum())
    f(model, X)
    grads = tc.grad(lambda m: f(m, X))(model)               # differentiating: not the fast path
    want = tc.grad(lambda m: m(tc.tensor(X)).sum())(model)
    np.testing.assert_allclose(grads[0].weight.numpy(), want[0].weight.numpy(), rtol=1e-5)


def test_a_models_arrays_are_checked_once_then_trusted_while_unchanged(monkeypatch):
    """The compiled call checks each parameter's array the first time only; a new array in
    any parameter (an eager optimizer step, load_state_dict) is checked again, and a freed
    one can never pass for a new one (weak references, not addresses)."""
    from tracecomp.runtime import compiled
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(10)])
    f = tc.trace(lambda m, x: m(x))
    x = tc.tensor(X)
    f(model, x)
    f(model, x)
    calls = []
    real = compiled.data_pointer
    monkeypatch.setattr(compiled, "data_pointer", lambda a: calls.append(a.shape) or real(a))
    f(model, tc.tensor(X))
    assert (3, 4) in calls and (4, 4) not in calls        # the new input only (and outputs)
    calls.clear()
    with tc.no_grad():
        model[3].weight.add_(1.0)           # an in-place change: a new array for that parameter
    np.testing.assert_allclose(f(model, x).numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert calls.count((4, 4)) == 1
    state = {k: v * 0.5 for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    np.testing.assert_allclose(f(model, x).numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_parameter_rebound_to_another_shape_or_dtype_retraces():
    model = _model()
    f = tc.trace(lambda m, x: m(x))
    f(model, X)
    f(model, X)
    model.to(tc.float64)
    out = f(model, X.astype(np.float64))
    assert out.dtype == tc.float64
    np.testing.assert_allclose(out.numpy(), model(tc.tensor(X.astype(np.float64))).detach().numpy(), rtol=1e-12)
