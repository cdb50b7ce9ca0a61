"""tc.nn.Module and the layers against torch.nn: the same state dict names, PyTorch's
weights loaded into tracecomp's layer give the same outputs (training and eval), and the
gradients of the parameters agree; the Module API; modules as pytrees under tc.trace and
tc.grad; initialization bounds; errors."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch")
nn = tc.nn
rng = np.random.default_rng(0)


def _np(t):
    return t.detach().numpy() if hasattr(t, "detach") else t.numpy()


def _load_from_torch(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


# (name, constructor arguments, input shape(s), input dtype)
LAYERS = [
    ("Linear", (5, 3), {}, [(4, 5)]),
    ("Linear", (5, 3), {"bias": False}, [(2, 4, 5)]),
    ("Bilinear", (3, 4, 2), {}, [(5, 3), (5, 4)]),
    ("Conv1d", (2, 4, 3), {"stride": 2, "padding": 1}, [(2, 2, 9)]),
    ("Conv2d", (3, 6, 3), {"padding": "same", "groups": 3, "bias": False}, [(2, 3, 7, 7)]),
    ("Conv2d", (2, 4, (3, 2)), {"stride": (2, 1), "dilation": 2}, [(1, 2, 9, 8)]),
    ("ConvTranspose2d", (4, 2, 3), {"stride": 2, "output_padding": 1}, [(2, 4, 5, 5)]),
    ("MaxPool2d", (2,), {}, [(2, 3, 6, 6)]),
    ("MaxPool2d", (3,), {"stride": 2, "padding": 1, "ceil_mode": True}, [(1, 2, 7, 7)]),
    ("AvgPool2d", (2,), {"count_include_pad": False, "padding": 1}, [(2, 3, 6, 6)]),
    ("AdaptiveAvgPool2d", ((2, 3),), {}, [(2, 3, 7, 8)]),
    ("BatchNorm1d", (4,), {}, [(6, 4)]),
    ("BatchNorm2d", (3,), {"momentum": None}, [(2, 3, 4, 4)]),
    ("BatchNorm2d", (3,), {"affine": False, "track_running_stats": False}, [(2, 3, 4, 4)]),
    ("LayerNorm", ((4, 5),), {}, [(3, 4, 5)]),
    ("GroupNorm", (2, 4), {}, [(2, 4, 3, 3)]),
    ("RMSNorm", (6,), {"eps": 1e-6}, [(3, 6)]),
    ("Embedding", (10, 4), {"padding_idx": 0}, [(3, 5)]),
    ("Flatten", (), {}, [(2, 3, 4)]),
    ("Identity", (), {}, [(2, 3)]),
    ("Dropout", (0.0,), {}, [(2, 3)]),
    ("ReLU", (), {}, [(2, 3)]), ("GELU", (), {"approximate": "tanh"}, [(2, 3)]), ("SiLU", (), {}, [(2, 3)]),
    ("Tanh", (), {}, [(2, 3)]), ("Sigmoid", (), {}, [(2, 3)]), ("LeakyReLU", (0.2,), {}, [(2, 3)]),
    ("ELU", (), {"alpha": 0.5}, [(2, 3)]), ("Softplus", (), {"beta": 2.0}, [(2, 3)]),
    ("Hardtanh", (-0.5, 0.5), {}, [(2, 3)]), ("Softmax", (), {"dim": 1}, [(2, 3)]),
    ("LogSoftmax", (), {"dim": -1}, [(2, 3)]),
    ("MultiheadAttention", (8, 2), {"batch_first": True}, [(2, 5, 8)] * 3),
    ("MultiheadAttention", (8, 2, 0.0, False), {"kdim": 3, "vdim": 6}, [(5, 2, 8), (4, 2, 3), (4, 2, 6)]),
    ("TransformerEncoderLayer", (8, 2, 16), {"dropout": 0.0, "batch_first": True}, [(2, 5, 8)]),
    ("TransformerEncoderLayer", (8, 2, 16), {"dropout": 0.0, "norm_first": True, "activation": "gelu"},
     [(5, 2, 8)]),
]


def _inputs(name, shapes):
    if name == "Embedding":
        return [rng.integers(0, 10, shapes[0])]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("name, args, kwargs, shapes", LAYERS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LAYERS)])
@pytest.mark.parametrize("training", [True, False])
def test_layer_matches_torch(name, args, kwargs, shapes, training):
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(*args, **kwargs)
    ours = getattr(nn, name)(*args, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _load_from_torch(ours, theirs)
    theirs.train(training)
    ours.train(training)
    xs = _inputs(name, shapes)
    t_in = [torch.tensor(x, requires_grad=x.dtype.kind == "f") for x in xs]
    want = theirs(*t_in)
    got = ours(*[tc.tensor(x) for x in xs])
    want, got = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
    np.testing.assert_allclose(got.numpy(), _np(want), rtol=1e-5, atol=1e-5)
    for (k, b), (k2, tb) in zip(ours.named_buffers(), theirs.named_buffers()):   # running statistics
        assert k == k2
        np.testing.assert_allclose(b.numpy(), _np(tb), rtol=1e-5, atol=1e-6)
    # the parameters' gradients: tc.grad over the module itself, a module-shaped gradient
    if not list(ours.parameters()):
        return
    weights = torch.tensor(rng.standard_normal(tuple(want.shape)).astype(np.float32))
    (want * weights).sum().backward()
    ours_again = getattr(nn, name)(*args, **kwargs)
    _load_from_torch(ours_again, theirs)       # (in training the running statistics do not matter)
    ours_again.train(training)

    def loss(m, *x):
        out = m(*x)
        return ((out[0] if isinstance(out, tuple) else out) * tc.tensor(weights.numpy())).sum()
    grads = tc.grad(loss)(ours_again, *[tc.tensor(x) for x in xs])
    assert isinstance(grads, type(ours_again))
    ours_named = dict(grads.named_parameters())
    for k, p in theirs.named_parameters():
        np.testing.assert_allclose(ours_named[k].numpy(), _np(p.grad), rtol=1e-4, atol=1e-5, err_msg=k)


# ---------------------------------------------------------------- the Module API

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})
        self.norms = nn.ModuleList([nn.BatchNorm1d(8)])
        self.scale = nn.Parameter(tc.ones(1))
        self.register_buffer("offset", tc.zeros(8))
        self.register_buffer("scratch", tc.zeros(2), persistent=False)
        self.label = "net"

    def forward(self, x):
        h = self.norms[0](self.body(x) + self.offset) * self.scale
        return self.heads["a"](h), self.heads["b"](h)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(8, 2), "b": torch.nn.Linear(8, 3)})
        self.norms = torch.nn.ModuleList([torch.nn.BatchNorm1d(8)])
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.register_buffer("offset", torch.zeros(8))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def test_module_api_matches_torch():
    ours, theirs = Net(), TorchNet()
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in theirs.named_parameters()]
    assert [k for k, _ in ours.named_buffers()] == [k for k, _ in theirs.named_buffers()]
    assert list(ours.state_dict()) == list(theirs.state_dict())          # 'scratch' is not persistent
    assert [k for k, _ in ours.named_modules()] == [k for k, _ in theirs.named_modules()]
    assert [type(m).__name__ for m in ours.children()] == ["Sequential", "ModuleDict", "ModuleList"]
    assert len(list(ours.parameters())) == len(list(theirs.parameters()))
    assert not ours.eval().training and not ours.body[0].training and ours.train().norms[0].training
    assert repr(ours.body) == repr(theirs.body)
    assert repr(nn.Conv2d(1, 2, 3, stride=2, padding=1, bias=False)) == \
        repr(torch.nn.Conv2d(1, 2, 3, stride=2, padding=1, bias=False))
    seen = []
    ours.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Linear") == 4
    ours.requires_grad_(False)
    assert not any(p.requires_grad for p in ours.parameters())
    ours.requires_grad_(True)
    ours(tc.ones(3, 4))[0].sum().backward()
    assert ours.body[0].weight.grad is not None
    ours.zero_grad()
    assert ours.body[0].weight.grad is None


def test_state_dict_round_trip_and_load_errors():
    a, b = Net(), Net()
    _ = b.load_state_dict(a.state_dict())
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=k)
    sd = dict(a.state_dict())
    del sd["body.0.weight"]
    sd["extra"] = tc.zeros(1)
    sd["heads.a.bias"] = tc.zeros(5)
    with pytest.raises(tc.CheckpointError, match=re.escape(
            "Error(s) in loading state_dict for Net from ckpt.safetensors:\n"
            '\tMissing key(s) in state_dict: "body.0.weight". \n'
            '\tUnexpected key(s) in state_dict: "extra". \n'
            "\tsize mismatch for heads.a.bias: copying a param with shape (5,) from checkpoint, "
            "the shape in current model is (2,).")):
        b.load_state_dict(sd, where="ckpt.safetensors")
    del sd["heads.a.bias"]
    keys = b.load_state_dict(sd, strict=False)
    assert keys.missing_keys == ["body.0.weight", "heads.a.bias"] and keys.unexpected_keys == ["extra"]


def test_a_module_is_a_pytree_for_trace_and_grad():
    tc.manual_seed(1)
    model = Net()
    x = rng.standard_normal((6, 4)).astype(np.float32)
    step = tc.trace(lambda m, x: m(x))
    eager_model = Net()
    eager_model.load_state_dict(model.state_dict())
    want = eager_model(tc.tensor(x))
    got = step(model, x)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-6)
    # the running statistics and the step count were written back into the model's buffers
    np.testing.assert_allclose(model.norms[0].running_mean.numpy(), eager_model.norms[0].running_mean.numpy(),
                               rtol=1e-5, atol=1e-7)
    assert model.norms[0].num_batches_tracked.item() == 1
    step(model, x)
    assert len(step._cache) == 1            # same structure and hyper-parameters: one trace
    model.eval()
    step(model, x)
    assert len(step._cache) == 2            # training is structure: eval retraces
    # a gradient shaped like the model: buffers get zeros, the int step count None
    g = tc.grad(lambda m: m(tc.tensor(x))[1].sum())(model)
    assert isinstance(g, Net) and g.norms[0].num_batches_tracked is None
    assert g.body[0].weight.shape == (8, 4)


def test_functional_style_train_step_compiles_once():
    """A whole SGD step on a model, compiled: the new parameters are returned as a model."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x, y = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((16, 1)).astype(np.float32)

    def step(m, x, y, lr):
        loss, g = tc.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(m)
        new = tc.tree_map(lambda p, d: p - lr * d, m, g)
        return loss, new
    compiled = tc.trace(step)
    eager = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    eager.load_state_dict(model.state_dict())
    losses, eager_losses = [], []
    for i in range(20):
        loss, model = compiled(model, x, y, np.float32(0.1))
        losses.append(loss.item())
        loss, eager = step(eager, x, y, np.float32(0.1))
        eager_losses.append(loss.item())
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])) and len(compiled._cache) == 1


def test_init_bounds_follow_pytorch():
    tc.manual_seed(0)
    lin = nn.Linear(100, 50)
    bound = 1 / math.sqrt(100)
    assert np.abs(lin.weight.numpy()).max() <= bound and np.abs(lin.weight.numpy()).max() > 0.9 * bound
    conv = nn.Conv2d(4, 8, 3)
    assert np.abs(conv.weight.numpy()).max() <= 1 / math.sqrt(36)
    w = nn.init.xavier_uniform_(tc.empty((30, 20)))
    assert np.abs(w.numpy()).max() <= math.sqrt(6 / 50)
    w = nn.init.kaiming_normal_(tc.empty((400, 300)), nonlinearity="relu")
    assert abs(w.numpy().std() - math.sqrt(2 / 300)) < 0.01 * math.sqrt(2 / 300) * 10
    emb = nn.Embedding(5, 3, padding_idx=2)
    assert (emb.weight.numpy()[2] == 0).all()
    tc.manual_seed(0)
    again = nn.Linear(100, 50)
    np.testing.assert_array_equal(again.weight.numpy(), lin.weight.numpy())     # seeded


def test_module_errors():
    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(tc.ones(2))
    with pytest.raises(tc.ArgumentError, match=r"before Module.__init__\(\) is called"):
        Early()
    with pytest.raises(tc.ArgumentError, match="in_channels .4. and out_channels .6. must both divide by groups .3."):
        nn.Conv2d(4, 6, 3, groups=3)
    lin = nn.Linear(2, 2)
    with pytest.raises(tc.ArgumentError, match="cannot assign a str as parameter 'weight' of Linear"):
        lin.weight = "w"
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'wieght'"):
        lin.wieght
    with pytest.raises(tc.ArgumentError, match="BatchNorm2d: expected a 4-D input, got shape"):
        nn.BatchNorm2d(3)(tc.ones(2, 3))


def test_transformer_layer_repr_matches_torch():
    ours = repr(nn.TransformerEncoderLayer(8, 2, 16))
    theirs = repr(torch.nn.TransformerEncoderLayer(8, 2, 16)).replace("NonDynamicallyQuantizableLinear", "Linear")
    assert ours == theirs


def test_a_checkpoint_round_trips_and_bad_ones_name_the_key_and_file(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file
    a, b = Net(), Net()
    path = tmp_path / "net.safetensors"
    tc.save(a.state_dict(), path)
    b.load_state_dict(tc.load_state(path))
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=k)
    # a file PyTorch wrote from the same model's state_dict loads when the names match
    theirs = TorchNet()
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(tmp_path / "torch.safetensors"))
    b.load_state_dict(tc.load_state(tmp_path / "torch.safetensors"))
    np.testing.assert_array_equal(b.body[0].weight.numpy(), theirs.body[0].weight.detach().numpy())
    bad = dict(a.state_dict())
    bad["heads.b.weight"] = tc.zeros((3, 8), dtype=tc.float64)
    del bad["scale"]
    tc.save(bad, tmp_path / "bad.safetensors")
    with pytest.raises(tc.CheckpointError, match=re.escape(
            f"Error(s) in loading state_dict for Net from {tmp_path / 'bad.safetensors'}:\n"
            '\tMissing key(s) in state_dict: "scale". \n'
            "\tdtype mismatch for heads.b.weight: copying a param with dtype float64 from checkpoint, "
            "the dtype in current model is float32")):
        b.load_state_dict(tc.load_state(tmp_path / "bad.safetensors"))


# ---------------------------------------------------------------- models with optimizers, against torch

def _mlp(lib):
    return lib.nn.Sequential(lib.nn.Linear(4, 16, bias=False), lib.nn.BatchNorm1d(16), lib.nn.Tanh(),
                             lib.nn.Linear(16, 3))


@pytest.mark.parametrize("name, kwargs", [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 1e-2}),
                                          ("AdamW", {"lr": 1e-2, "weight_decay": 0.1})])
@pytest.mark.parametrize("compiled", [False, True])
def test_twenty_steps_of_a_model_match_torch(name, kwargs, compiled):
    torch.manual_seed(0)
    theirs = _mlp(torch)
    ours = _mlp(tc)
    _load_from_torch(ours, theirs)
    x = rng.standard_normal((32, 4)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    t_opt = getattr(torch.optim, name)(theirs.parameters(), **kwargs)
    if compiled:
        opt = getattr(tc.optim, name)(**kwargs)
        state = opt.init(ours)

        def step(m, state, x, y):
            loss, g = tc.value_and_grad(lambda m: tc.nn.functional.cross_entropy(m(x), y))(m)
            m, state = opt.update(g, state, m)
            return loss, m, state
        run = tc.trace(step, donate_argnums=(0, 1))
    else:
        opt = getattr(tc.optim, name)(ours.parameters(), **kwargs)
    for _ in range(20):
        t_opt.zero_grad()
        want = torch.nn.functional.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y))
        want.backward()
        t_opt.step()
        if compiled:
            loss, ours, state = run(ours, state, x, y)
        else:
            opt.zero_grad()
            loss = tc.nn.functional.cross_entropy(ours(tc.tensor(x)), tc.tensor(y))
            loss.backward()
            opt.step()
        np.testing.assert_allclose(loss.item(), want.item(), rtol=2e-5)
    if compiled:
        assert len(run._cache) == 1
    for (k, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        np.testing.assert_allclose(a.numpy(), _np(b), rtol=1e-4, atol=1e-5, err_msg=k)


def test_to_casts_in_place_so_an_optimizer_keeps_its_parameters():
    m = nn.Linear(2, 3)
    w = m.weight
    opt = tc.optim.SGD(m.parameters(), lr=0.1)
    m.double()
    assert m.weight is w and w.dtype == tc.float64 and w.requires_grad
    m(tc.ones((4, 2), dtype=tc.float64)).sum().backward()
    before = w.numpy().copy()
    opt.step()
    np.testing.assert_allclose(w.numpy(), before - 0.1 * 4)
