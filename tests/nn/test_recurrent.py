"""tc.nn.RNN, LSTM and GRU against torch.nn: the same state dict keys and shapes, PyTorch's
weights give the same outputs and final states (float64 tight, float32 loose) over the
configurations (layers, directions, batch_first, unbatched, hx, bias), and the same
gradients for the input, the initial state and every parameter: eager autograd, tc.grad,
and traced (tc.trace with the reference interpreter).  Traced, each layer and direction is
one tc.scan op, so the graph does not grow with the sequence length.  Also dropout between
layers, training with Adam, initialization, repr and errors."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch")
nn = tc.nn
rng = np.random.default_rng(0)

# tc.trace compiles loops only once the scan lowering lands; until then traced tests run
# the graph on the reference interpreter
INTERP = "interp"


def _np(t):
    return t.detach().numpy() if hasattr(t, "detach") else t.numpy()


def _load_from_torch(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def _pair(name, kwargs, dtype):
    """A torch layer and ours with its weights, both in `dtype` (np.float32 or np.float64)."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(**kwargs)
    theirs = theirs.double() if dtype == np.float64 else theirs
    ours = getattr(nn, name)(**kwargs, dtype=tc.float64 if dtype == np.float64 else tc.float32)
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
    _load_from_torch(ours, theirs)
    return ours, theirs


def _states(name, kwargs, shape, dtype):
    """Random initial states of the shape PyTorch wants for an input of `shape`."""
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    batch = () if len(shape) == 2 else (shape[0] if kwargs.get("batch_first") else shape[1],)
    h = rng.standard_normal((layers, *batch, kwargs["hidden_size"])).astype(dtype)
    return (h, rng.standard_normal(h.shape).astype(dtype)) if name == "LSTM" else h


# (layer, constructor arguments, input shape, hx given)
CONFIGS = [
    ("LSTM", {"input_size": 4, "hidden_size": 5}, (6, 3, 4), False),
    ("LSTM", {"input_size": 4, "hidden_size": 3, "num_layers": 2, "bidirectional": True}, (5, 2, 4), True),
    ("LSTM", {"input_size": 3, "hidden_size": 4, "batch_first": True, "bias": False}, (2, 7, 3), True),
    ("LSTM", {"input_size": 3, "hidden_size": 4, "num_layers": 2}, (5, 3), True),                # unbatched
    ("LSTM", {"input_size": 3, "hidden_size": 2, "bidirectional": True, "batch_first": True}, (4, 3), False),
    ("GRU", {"input_size": 4, "hidden_size": 5}, (6, 3, 4), False),
    ("GRU", {"input_size": 4, "hidden_size": 3, "num_layers": 2, "bidirectional": True, "batch_first": True},
     (2, 5, 4), True),
    ("GRU", {"input_size": 3, "hidden_size": 4, "bias": False}, (5, 3), True),
    ("RNN", {"input_size": 4, "hidden_size": 5}, (6, 3, 4), False),
    ("RNN", {"input_size": 4, "hidden_size": 3, "num_layers": 2, "bidirectional": True, "nonlinearity": "relu"},
     (5, 2, 4), True),
    ("RNN", {"input_size": 3, "hidden_size": 4, "nonlinearity": "relu", "bias": False, "batch_first": True},
     (2, 5, 3), False),
    ("RNN", {"input_size": 3, "hidden_size": 4, "num_layers": 2, "bidirectional": True}, (5, 3), True),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CONFIGS)]
TOL = {np.float64: {"rtol": 1e-12, "atol": 1e-13}, np.float32: {"rtol": 1e-5, "atol": 1e-6}}


def _as_tc(hx):
    return None if hx is None else tuple(tc.tensor(h) for h in hx) if isinstance(hx, tuple) else tc.tensor(hx)


def _as_torch(hx, requires_grad=False):
    if hx is None:
        return None
    if isinstance(hx, tuple):
        return tuple(torch.tensor(h, requires_grad=requires_grad) for h in hx)
    return torch.tensor(hx, requires_grad=requires_grad)


def _check_outputs(name, got, want, tol):
    (out, state), (t_out, t_state) = got, want
    assert tuple(out.shape) == tuple(t_out.shape)
    np.testing.assert_allclose(out.numpy(), _np(t_out), **tol)
    if name == "LSTM":
        assert isinstance(state, tuple) and len(state) == 2
        for s, t in zip(state, t_state):
            assert tuple(s.shape) == tuple(t.shape)
            np.testing.assert_allclose(s.numpy(), _np(t), **tol)
    else:
        assert tuple(state.shape) == tuple(t_state.shape)
        np.testing.assert_allclose(state.numpy(), _np(t_state), **tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, kwargs, shape, with_hx", CONFIGS, ids=IDS)
def test_forward_matches_torch(name, kwargs, shape, with_hx, dtype):
    ours, theirs = _pair(name, kwargs, dtype)
    x = rng.standard_normal(shape).astype(dtype)
    hx = _states(name, kwargs, shape, dtype) if with_hx else None
    want = theirs(torch.tensor(x), _as_torch(hx))
    _check_outputs(name, ours(tc.tensor(x), _as_tc(hx)), want, TOL[dtype])
    # traced: the same numbers from the graph (one scan per layer and direction)
    traced = tc.trace(lambda m, x, hx: m(x, hx), backend=INTERP)
    _check_outputs(name, traced(ours, x, _as_tc(hx)), want, TOL[dtype])


# ---------------------------------------------------------------- gradients

def _loss_weights(name, want):
    out, state = want
    states = state if name == "LSTM" else (state,)
    return [rng.standard_normal(tuple(t.shape)) for t in (out, *states)]


def _weighted(outputs, weights, lib):
    out, state = outputs
    states = state if isinstance(state, tuple) else (state,)
    return sum((t * lib.tensor(w)).sum() for t, w in zip((out, *states), weights))


def _torch_grads(name, theirs, x, hx):
    tx = torch.tensor(x, requires_grad=True)
    thx = _as_torch(hx, requires_grad=True)
    want = theirs(tx, thx)
    weights = _loss_weights(name, want)
    _weighted(want, weights, torch).backward()
    hx_grads = None if hx is None else tuple(h.grad for h in thx) if isinstance(thx, tuple) else thx.grad
    return weights, tx.grad, hx_grads, {k: p.grad for k, p in theirs.named_parameters()}


def _check_grads(name, got, want, tol):
    (g_x, g_hx, g_params), (t_x, t_hx, t_params) = got, want
    np.testing.assert_allclose(_np(g_x), _np(t_x), **tol, err_msg="input")
    if t_hx is not None:
        for g, t in zip(g_hx if isinstance(g_hx, tuple) else (g_hx,), t_hx if isinstance(t_hx, tuple) else (t_hx,)):
            np.testing.assert_allclose(_np(g), _np(t), **tol, err_msg="hx")
    assert set(g_params) == set(t_params)
    for k, t in t_params.items():
        np.testing.assert_allclose(_np(g_params[k]), _np(t), **tol, err_msg=k)


GRAD_CONFIGS = [CONFIGS[i] for i in (1, 2, 3, 6, 7, 9, 10)]
GRAD_IDS = [IDS[i] for i in (1, 2, 3, 6, 7, 9, 10)]
GRAD_TOL = {np.float64: {"rtol": 1e-10, "atol": 1e-12}, np.float32: {"rtol": 2e-4, "atol": 2e-5}}


@pytest.mark.parametrize("how", ["backward", "grad", "traced"])
@pytest.mark.parametrize("name, kwargs, shape, with_hx", GRAD_CONFIGS, ids=GRAD_IDS)
def test_gradients_match_torch(name, kwargs, shape, with_hx, how):
    """The gradient of a weighted sum of output, h_n (and c_n) w.r.t. the input, hx and every
    parameter: eager autograd (.backward()), tc.grad over the module as a pytree, and
    tc.value_and_grad traced."""
    dtype = np.float64
    ours, theirs = _pair(name, kwargs, dtype)
    x = rng.standard_normal(shape).astype(dtype)
    hx = _states(name, kwargs, shape, dtype) if with_hx else None
    weights, *want = _torch_grads(name, theirs, x, hx)
    if how == "backward":
        tx = tc.tensor(x, requires_grad=True)
        thx = _as_tc(hx)
        for h in (thx if isinstance(thx, tuple) else () if thx is None else (thx,)):
            h.requires_grad_()
        _weighted(ours(tx, thx), weights, tc).backward()
        g_hx = None if hx is None else tuple(h.grad for h in thx) if isinstance(thx, tuple) else thx.grad
        got = (tx.grad, g_hx, {k: p.grad for k, p in ours.named_parameters()})
    else:
        def loss(m, x, hx):
            return _weighted(m(x, hx), weights, tc)
        fn = tc.value_and_grad(loss, argnums=(0, 1, 2))
        if how == "traced":
            fn = tc.trace(fn, backend=INTERP)
        value, (g_m, g_x, g_hx) = fn(ours, tc.tensor(x), _as_tc(hx))
        np.testing.assert_allclose(value.item(), _weighted(theirs(torch.tensor(x), _as_torch(hx)),
                                                           weights, torch).item(), rtol=1e-12)
        assert isinstance(g_m, type(ours))
        got = (g_x, g_hx, dict(g_m.named_parameters()))
    _check_grads(name, got, want, GRAD_TOL[dtype])


@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
def test_float32_gradients_traced_match_torch(name):
    kwargs = {"input_size": 4, "hidden_size": 6, "num_layers": 2, "bidirectional": True}
    ours, theirs = _pair(name, kwargs, np.float32)
    x = rng.standard_normal((7, 3, 4)).astype(np.float32)
    weights, *want = _torch_grads(name, theirs, x, None)
    fn = tc.trace(tc.grad(lambda m, x: _weighted(m(x), weights, tc), argnums=(0, 1)), backend=INTERP)
    g_m, g_x = fn(ours, x)
    _check_grads(name, (g_x, None, dict(g_m.named_parameters())), want, GRAD_TOL[np.float32])


# ---------------------------------------------------------------- the graph

def _graph(model, steps):
    x = rng.standard_normal((steps, 2, 3)).astype(np.float32)
    return tc.trace(lambda m, x: m(x), backend=INTERP).lower(model, x).as_text("graph")


def _ops(text):
    return re.findall(r'"(tc\.\w+)"', text)


def test_the_traced_graph_is_one_scan_per_layer_and_direction_whatever_the_length():
    model = nn.LSTM(3, 8)
    short, long = _graph(model, 5), _graph(model, 50)
    assert _ops(long).count("tc.scan") == 1
    assert "length = 50" in long and "length = 5 " in short
    assert _ops(short) == _ops(long)          # the same ops: the graph does not grow with the steps
    # the input projection of all steps is one matmul before the loop; the loop body holds
    # the recurrent matmul only
    body = long[long.index('"tc.scan"'):long.index('"tc.yield"')]
    top = long.replace(body, "")
    assert _ops(body).count("tc.matmul") == 1 and "tensor<50x2x32xf32>" in top
    deep = _graph(nn.GRU(3, 4, num_layers=2, bidirectional=True), 50)
    assert _ops(deep).count("tc.scan") == 4


def test_a_reverse_scan_runs_the_backward_direction():
    text = _graph(nn.RNN(3, 4, bidirectional=True), 6)
    assert "reverse = false" in text and "reverse = true" in text


# ---------------------------------------------------------------- dropout between layers

@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
def test_dropout_between_layers_follows_torch(name):
    kwargs = {"input_size": 3, "hidden_size": 4, "num_layers": 3, "dropout": 1.0}
    ours, theirs = _pair(name, kwargs, np.float64)
    x = rng.standard_normal((5, 2, 3))
    for training in (True, False):
        # p = 1 zeroes every input of layers 1 and 2 in training: deterministic, comparable
        ours.train(training)
        theirs.train(training)
        want = theirs(torch.tensor(x))
        _check_outputs(name, ours(tc.tensor(x)), want, TOL[np.float64])
        _check_outputs(name, tc.trace(lambda m, x: m(x), backend=INTERP)(ours, x), want, TOL[np.float64])


def test_dropout_draws_a_fresh_mask_in_training_only():
    model = nn.GRU(3, 16, num_layers=2, dropout=0.5)
    x = tc.tensor(rng.standard_normal((4, 2, 3)).astype(np.float32))
    tc.manual_seed(0)
    a, _ = model(x)
    b, _ = model(x)
    assert not np.allclose(a.numpy(), b.numpy())
    model.eval()
    np.testing.assert_array_equal(model(x)[0].numpy(), model(x)[0].numpy())
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(3, 4, dropout=0.2)


# ---------------------------------------------------------------- training

def _sequence_task():
    """Predict the running mean of a noisy signal: an LSTM and a linear head.  Its own seed:
    the data must not depend on which tests ran before (the module's rng)."""
    x = np.random.default_rng(7).standard_normal((12, 8, 2)).astype(np.float32)
    y = (np.cumsum(x[..., :1], 0) / np.arange(1, 13)[:, None, None]).astype(np.float32)
    return x, y


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(2, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


def test_adam_training_decreases_the_loss_eagerly():
    tc.manual_seed(0)
    model, (x, y) = Regressor(), _sequence_task()
    opt = tc.optim.Adam(model.parameters(), lr=2e-2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = ((model(tc.tensor(x)) - tc.tensor(y)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("options", [{"backend": INTERP}, {"donate_argnums": (0, 1)}],
                         ids=["interpreter", "compiled"])
def test_adam_training_step_traced_decreases_the_loss_and_traces_once(options):
    tc.manual_seed(0)
    model, (x, y) = Regressor(), _sequence_task()
    opt = tc.optim.Adam(lr=2e-2)
    state = opt.init(model)

    def step(m, state, x, y):
        loss, g = tc.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(m)
        m, state = opt.update(g, state, m)
        return loss, m, state
    run = tc.trace(step, **options)
    losses = []
    for _ in range(15):
        loss, model, state = run(model, state, x, y)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0] and len(run._cache) == 1


@pytest.mark.parametrize("index", [1, 6, 9], ids=[IDS[i] for i in (1, 6, 9)])
def test_compiled_backend_matches_torch(index):
    name, kwargs, shape, _ = CONFIGS[index]
    ours, theirs = _pair(name, kwargs, np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    weights, *want = _torch_grads(name, theirs, x, None)
    _check_outputs(name, tc.trace(lambda m, x: m(x))(ours, x), theirs(torch.tensor(x)),
                   {"rtol": 1e-4, "atol": 1e-5})
    g_m, g_x = tc.trace(tc.grad(lambda m, x: _weighted(m(x), weights, tc), argnums=(0, 1)))(ours, x)
    _check_grads(name, (g_x, None, dict(g_m.named_parameters())), want, GRAD_TOL[np.float32])


# ---------------------------------------------------------------- construction and errors

def test_init_bounds_and_seeding_follow_pytorch():
    tc.manual_seed(0)
    lstm = nn.LSTM(10, 25, num_layers=2)
    bound = 1 / math.sqrt(25)
    for k, p in lstm.named_parameters():
        v = np.abs(p.numpy())
        assert v.max() <= bound and v.max() > 0.9 * bound, k
    tc.manual_seed(0)
    again = nn.LSTM(10, 25, num_layers=2)
    for (k, a), (_, b) in zip(lstm.named_parameters(), again.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    assert len(lstm.all_weights) == 2 and [tuple(w.shape) for w in lstm.all_weights[1]] == \
        [(100, 25), (100, 25), (100,), (100,)]
    lstm.flatten_parameters()


@pytest.mark.parametrize("name, args, kwargs", [
    ("LSTM", (3, 4), {}), ("GRU", (3, 4, 2), {"dropout": 0.5, "bidirectional": True}),
    ("RNN", (3, 4), {"nonlinearity": "relu", "bias": False, "batch_first": True}),
    ("LSTM", (3, 4), {"num_layers": 3, "batch_first": True})])
def test_repr_matches_torch(name, args, kwargs):
    assert repr(getattr(nn, name)(*args, **kwargs)) == repr(getattr(torch.nn, name)(*args, **kwargs))


def test_errors():
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(tc.TracecompError, match="proj_size is only supported for LSTM"):
        nn.RNNBase("GRU", 3, 4, proj_size=2)
    with pytest.raises(tc.ArgumentError, match="unknown nonlinearity 'sigmoid'"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(tc.ArgumentError, match="dropout should be a number in range"):
        nn.GRU(3, 4, num_layers=2, dropout=1.5)
    with pytest.raises(tc.ArgumentError, match="hidden_size must be a positive int"):
        nn.RNN(3, 0)
    lstm, gru = nn.LSTM(3, 4), nn.GRU(3, 4)
    with pytest.raises(tc.ShapeError, match=r"input.size\(-1\) must be equal to input_size. Expected 3, got 5"):
        lstm(tc.zeros(2, 3, 5))
    with pytest.raises(tc.ShapeError, match="expected a 2-D .unbatched. or 3-D .batched. input"):
        lstm(tc.zeros(3))
    with pytest.raises(tc.ShapeError, match=r"expected h_0 of size \(1, 3, 4\), got \(1, 2, 4\)"):
        gru(tc.zeros(2, 3, 3), tc.zeros(1, 2, 4))
    with pytest.raises(tc.ShapeError, match="for an unbatched 2-D input, c_0 should also be 2-D"):
        lstm(tc.zeros(2, 3), (tc.zeros(1, 4), tc.zeros(1, 1, 4)))
    with pytest.raises(tc.ArgumentError, match=r"LSTM: hx must be a pair \(h_0, c_0\)"):
        lstm(tc.zeros(2, 3, 3), tc.zeros(1, 3, 4))
    with pytest.raises(tc.ArgumentError, match="GRU: hx must be a tensor h_0"):
        gru(tc.zeros(2, 3, 3), (tc.zeros(1, 3, 4), tc.zeros(1, 3, 4)))
    with pytest.raises(tc.DTypeError, match="input dtype .*float64.* does not match weight dtype"):
        lstm(tc.zeros(2, 3, 3, dtype=tc.float64))
    with pytest.raises(tc.ShapeError, match="sequence length larger than 0"):
        gru(tc.zeros(0, 3, 3))
