"""Small PyTorch models compiled with backend="tracecomp" against eager PyTorch: an MLP, a
CNN with batch norm, a transformer block; forward values and every parameter's gradient in
float32 and float64, every op compiled (no fallback), inference under torch.no_grad(), and an
AdamW loop that compiles once."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (a test-only dependency)")
if not hasattr(torch, "compile"):          # tests/torch/ itself, seen as a namespace package
    pytest.skip("torch not installed (a test-only dependency)", allow_module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tracecomp.torch as tt  # noqa: E402

DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tolerance(dtype):
    return dict(rtol=2e-4, atol=2e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 32), nn.Linear(32, 32), nn.Linear(32, 5)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = F.gelu(self.fc2(h)) * F.softmax(h, dim=-1)
        return self.fc3(h)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.relu(self.bn2(self.conv2(h)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class Block(nn.Module):
    """Token and position embeddings, a pre-norm block with causal attention (fused
    F.scaled_dot_product_attention, or written out), a GELU MLP, a language-model head."""

    def __init__(self, vocab=11, width=16, heads=2, context=6, fused=True):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab, bias=False)

    def attention(self, h):
        b, t, c = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            a = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(a.transpose(1, 2).reshape(b, t, c))

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        x = x + self.attention(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.ln_f(x))


def inputs_of(name, dtype):
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        return torch.randn(8, 12, generator=g, dtype=dtype), torch.randint(0, 5, (8,), generator=g)
    if name == "cnn":
        return torch.randn(4, 3, 10, 10, generator=g, dtype=dtype), torch.randint(0, 4, (4,), generator=g)
    idx = torch.randint(0, 11, (3, 6), generator=g)
    return idx, torch.randint(0, 11, (3, 6), generator=g)


def model_of(name, dtype):
    torch.manual_seed(0)
    model = {"mlp": MLP, "cnn": CNN, "block": Block, "block-manual": lambda: Block(fused=False)}[name]()
    return model.to(dtype)


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def pair(name, dtype):
    model = model_of(name, dtype)
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "block", "block-manual"])
def test_forward_and_every_gradient_match_eager(name, dtype):
    model, eager = pair(name, dtype)
    x, y = inputs_of(name.split("-")[0], dtype)
    reports = []
    loss = torch.compile(lambda x, y: loss_of(model, x, y), backend="tracecomp",
                         options={"report": reports.append})(x, y)
    expected = loss_of(eager, x, y)
    tol = tolerance(dtype)
    torch.testing.assert_close(loss, expected, **tol)
    loss.backward()
    expected.backward()
    assert [r.kind for r in reports] == ["forward", "backward"]
    assert all(not r.fallback and r.partitions == 1 for r in reports), [dict(r.fallback) for r in reports]
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"{name} {n}.grad: {m}")
    for (n, b), c in zip(model.named_buffers(), eager.buffers()):      # batch norm's running statistics
        torch.testing.assert_close(b, c, **tol, msg=lambda m: f"{name} buffer {n}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "block"])
def test_inference_under_no_grad(name, dtype):
    model, eager = pair(name, dtype)
    model.eval()
    eager.eval()
    x, _ = inputs_of(name, dtype)
    before = tt.counts["inference"]
    with torch.no_grad():
        out = torch.compile(model, backend="tracecomp")(x)
        expected = eager(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, expected, **tolerance(dtype))
    assert tt.counts["inference"] == before + 1


def test_batch_norm_in_evaluation_mode_with_gradients():
    model, eager = pair("cnn", torch.float64)
    model.eval()
    eager.eval()
    x, y = inputs_of("cnn", torch.float64)
    loss = torch.compile(lambda x, y: loss_of(model, x, y), backend="tracecomp")(x, y)
    expected = loss_of(eager, x, y)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("name", ["mlp", "block"])
def test_adamw_steps_give_eager_losses_and_compile_once(name):
    dtype = torch.float32
    model, eager = pair(name, dtype)
    x, y = inputs_of(name, dtype)
    step_loss = torch.compile(lambda x, y: loss_of(model, x, y), backend="tracecomp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    before = dict(tt.counts)
    losses, expected = [], []
    for _ in range(5):
        for m, o, f, out in ((model, opt, step_loss, losses), (eager, eager_opt, lambda x, y: loss_of(eager, x, y), expected)):
            o.zero_grad()
            loss = f(x, y)
            loss.backward()
            o.step()
            out.append(loss.item())
    assert losses == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert expected[-1] < expected[0]
    grown = {k: tt.counts[k] - before.get(k, 0) for k in ("dynamo", "forward", "backward", "inference", "traces")}
    # parameters are graph inputs: the optimizer's in-place updates need no new graph or trace
    assert grown == {"dynamo": 1, "forward": 1, "backward": 1, "inference": 0, "traces": 2}, grown


class MoreLayers(nn.Module):
    """Layers whose ATen ops the hand-written rules cover beyond the models above: group
    norm, average pools, transposed and 1-d convolutions, batch norm without running
    statistics, sigmoid/tanh/log-softmax (and, through their backward, index ops)."""

    def __init__(self):
        super().__init__()
        self.conv_t = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.bn = nn.BatchNorm2d(4, track_running_stats=False)
        self.conv1d = nn.Conv1d(4, 3, 3, padding=1, groups=1)
        self.fc = nn.Linear(3 * 6, 5)

    def forward(self, x):
        h = torch.sigmoid(self.gn(self.conv_t(x)))                     # (n, 4, 12, 12)
        h = F.avg_pool2d(torch.tanh(self.bn(h)), 2, ceil_mode=True)     # (n, 4, 6, 6)
        h = F.adaptive_avg_pool2d(h, (2, 3)).flatten(2)                 # (n, 4, 6)
        h = F.max_pool1d(self.conv1d(h), 1)
        return F.log_softmax(self.fc(h.flatten(1)), -1)


def test_more_layers_forward_and_gradients_in_float64():
    torch.manual_seed(0)
    model = MoreLayers().double()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    reports = []
    out = torch.compile(model, backend="tracecomp", options={"report": reports.append})(x)
    expected = eager(x)
    torch.testing.assert_close(out, expected)
    (out[:, 1] - out[:, 3]).sum().backward()
    (expected[:, 1] - expected[:, 3]).sum().backward()
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m: f"{n}.grad: {m}")
    assert all(not r.fallback for r in reports), [dict(r.fallback) for r in reports]


def test_dropout_draws_its_mask_and_the_backward_uses_it():
    model = nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.25))
    x = torch.randn(32, 64)
    out = torch.compile(model, backend="tracecomp")(x)
    dropped = out == 0
    assert 0.15 < dropped.float().mean().item() < 0.35              # tracecomp's generator, not PyTorch's
    kept = model[0](x)
    torch.testing.assert_close(out[~dropped], (kept / 0.75)[~dropped])
    out.sum().backward()
    expected = (~dropped).to(x.dtype).t() @ x / 0.75                  # d(sum)/dW through the same mask
    torch.testing.assert_close(model[0].weight.grad, expected, rtol=1e-4, atol=1e-4)
