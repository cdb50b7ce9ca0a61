"""tc.autocast against torch.autocast("cpu"): each op's output dtype, a small MLP and an
attention block (values within bfloat16's tolerance, gradients' dtypes and values), eagerly,
under tc.trace (casts in the graph, programs keyed by the autocast state) and tc.grad."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import ArgumentError, DTypeError, TableError
from tracecomp.ops.table import default_table, load_table

torch = pytest.importorskip("torch")
F = torch.nn.functional
tF = tc.nn.functional
RTOL = ATOL = 3e-2          # a few bfloat16 roundings (8 bits of mantissa)


def _np(t) -> np.ndarray:
    return t.detach().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t).astype(np.float32)


def _pair(rng, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    return tc.tensor(a), torch.tensor(a)


# (name, fn(lib, functional, *tensors), input shapes): each runs the same calls in both libraries
OPS = [
    ("linear", lambda m, f, a, b: f.linear(a, b), [(4, 8), (3, 8)]),
    ("matmul", lambda m, f, a, b: m.matmul(a, b), [(4, 8), (8, 3)]),
    ("mm", lambda m, f, a, b: m.mm(a, b), [(4, 8), (8, 3)]),
    ("bmm", lambda m, f, a, b: m.bmm(a, b), [(2, 4, 8), (2, 8, 3)]),
    ("addmm", lambda m, f, c, a, b: m.addmm(c, a, b), [(4, 3), (4, 8), (8, 3)]),
    ("baddbmm", lambda m, f, c, a, b: m.baddbmm(c, a, b), [(2, 4, 3), (2, 4, 8), (2, 8, 3)]),
    ("conv2d", lambda m, f, x, w: f.conv2d(x, w), [(1, 2, 5, 5), (3, 2, 3, 3)]),
    ("sdpa", lambda m, f, q, k, v: f.scaled_dot_product_attention(q, k, v, is_causal=True),
     [(1, 2, 4, 8)] * 3),
    ("softmax", lambda m, f, a: f.softmax(a, -1), [(4, 8)]),
    ("layer_norm", lambda m, f, a: f.layer_norm(a, (8,)), [(4, 8)]),
    ("sum", lambda m, f, a: a.sum(), [(4, 8)]),
    ("exp", lambda m, f, a: a.exp(), [(4, 8)]),
    ("mse_loss", lambda m, f, a, b: f.mse_loss(a, b), [(4, 8), (4, 8)]),
    ("prod", lambda m, f, a: a.prod(), [(4,)]),
    ("matmul_then_add", lambda m, f, a, b: m.matmul(a, b) + a[:, :3], [(4, 8), (8, 3)]),
    ("matmul_then_softmax", lambda m, f, a, b: f.softmax(m.matmul(a, b), -1), [(4, 8), (8, 3)]),
    ("matmul_then_cross_entropy", lambda m, f, a, b: f.cross_entropy(m.matmul(a, b), m.tensor([0, 2, 1, 0])),
     [(4, 8), (8, 3)]),
    ("cat_mixed", lambda m, f, a, b: m.cat([m.matmul(a, b), a[:, :3]]), [(4, 8), (8, 3)]),
    ("conv1d", lambda m, f, x, w: f.conv1d(x, w), [(1, 2, 7), (3, 2, 3)]),
    ("conv1d_same", lambda m, f, x, w: f.conv1d(x, w, padding="same"), [(1, 2, 7), (3, 2, 3)]),
    ("conv2d_same", lambda m, f, x, w: f.conv2d(x, w, padding="same"), [(1, 2, 5, 5), (3, 2, 3, 3)]),
    ("conv_transpose2d", lambda m, f, x, w: f.conv_transpose2d(x, w), [(1, 2, 4, 4), (2, 3, 3, 3)]),
    ("cdist", lambda m, f, a, b: m.cdist(a, b), [(4, 8), (5, 8)]),
    ("prod_of_bf16", lambda m, f, a, b: (0.5 * m.matmul(a, b)).prod(), [(2, 8), (8, 2)]),
    ("mse_of_bf16", lambda m, f, a, b, c: f.mse_loss(m.matmul(a, b), c), [(4, 8), (8, 3), (4, 3)]),
    ("nll_loss", lambda m, f, a, b: f.nll_loss(f.log_softmax(m.matmul(a, b), -1), m.tensor([0, 2, 1, 0])),
     [(4, 8), (8, 3)]),
    ("binary_cross_entropy", lambda m, f, a, b, c: f.binary_cross_entropy(m.sigmoid(m.matmul(a, b)), m.sigmoid(c)),
     [(4, 8), (8, 3), (4, 3)]),
    ("bce_with_logits", lambda m, f, a, b, c: f.binary_cross_entropy_with_logits(m.matmul(a, b), m.sigmoid(c)),
     [(4, 8), (8, 3), (4, 3)]),
    ("l1_loss", lambda m, f, a, b, c: f.l1_loss(m.matmul(a, b), c), [(4, 8), (8, 3), (4, 3)]),
    ("smooth_l1_loss", lambda m, f, a, b, c: f.smooth_l1_loss(m.matmul(a, b), c), [(4, 8), (8, 3), (4, 3)]),
    ("huber_loss", lambda m, f, a, b, c: f.huber_loss(m.matmul(a, b), c), [(4, 8), (8, 3), (4, 3)]),
    ("kl_div", lambda m, f, a, b, c: f.kl_div(f.log_softmax(m.matmul(a, b), -1), f.softmax(c, -1), reduction="sum"),
     [(4, 8), (8, 3), (4, 3)]),
    ("stack_mixed", lambda m, f, a, b, c: m.stack([m.matmul(a, b), c]), [(4, 8), (8, 3), (4, 3)]),
    ("index_copy_mixed", lambda m, f, a, b, c: m.matmul(a, b).index_copy(0, m.tensor([0, 2]), c),
     [(4, 8), (8, 3), (2, 3)]),
]
# The ops.yaml entries (full names) with an `autocast` policy that each case above reaches
COVERS = {"linear": ["linear"], "matmul": ["matmul"], "mm": ["mm"], "bmm": ["bmm"], "addmm": ["addmm"],
          "baddbmm": ["baddbmm"], "conv2d": ["conv2d"], "sdpa": ["scaled_dot_product_attention"],
          "prod": ["prod"], "mse_loss": ["mse_loss"], "matmul_then_cross_entropy": ["cross_entropy"],
          "cat_mixed": ["cat"], "conv1d": ["conv1d"], "conv1d_same": ["conv1d.padding"],
          "conv2d_same": ["conv2d.padding"], "conv_transpose2d": ["conv_transpose2d"], "cdist": ["cdist"],
          "nll_loss": ["nll_loss"], "binary_cross_entropy": ["binary_cross_entropy"],
          "bce_with_logits": ["binary_cross_entropy_with_logits"], "l1_loss": ["l1_loss"],
          "smooth_l1_loss": ["smooth_l1_loss"], "huber_loss": ["huber_loss"], "kl_div": ["kl_div"],
          "stack_mixed": ["stack"], "index_copy_mixed": ["index_copy"]}


def test_every_op_with_an_autocast_policy_is_compared_with_torch():
    policied = {name for name, op in default_table().items() if op.autocast}
    covered = {name for case in COVERS.values() for name in case}
    assert policied <= covered, f"ops.yaml ops with an autocast policy no case here checks: {sorted(policied - covered)}"
    assert set(COVERS) <= {o[0] for o in OPS}


@pytest.mark.parametrize("name,fn,shapes", OPS, ids=[o[0] for o in OPS])
@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_op_dtype_and_value_as_torch(name, fn, shapes, low):
    rng = np.random.default_rng(0)
    pairs = [_pair(rng, *s) for s in shapes]
    with tc.autocast(dtype=getattr(tc, low)):
        got = fn(tc, tF, *[p[0] for p in pairs])
    with torch.autocast("cpu", dtype=getattr(torch, low)):
        want = fn(torch, F, *[p[1] for p in pairs])
    assert got.dtype.label == str(want.dtype).removeprefix("torch."), name
    np.testing.assert_allclose(_np(got), _np(want), rtol=RTOL, atol=ATOL)


def _mlp_params(rng):
    return {k: rng.standard_normal(s).astype(np.float32) * 0.3 for k, s in
            [("w1", (32, 16)), ("b1", (32,)), ("w2", (10, 32)), ("b2", (10,))]}


def _mlp(m, f, p, x, y):
    h = f.relu(f.linear(x, p["w1"], p["b1"]))
    logits = f.linear(h, p["w2"], p["b2"])
    return logits, f.cross_entropy(logits, y)


def _leaves(arrays, lib):
    if lib is torch:
        return {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
    return {k: tc.tensor(v, requires_grad=True) for k, v in arrays.items()}


def test_mlp_eager_values_dtypes_and_gradients_as_torch():
    rng = np.random.default_rng(1)
    params, x, y = _mlp_params(rng), rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 10, 8)
    outs = {}
    for lib, f, auto in [(tc, tF, tc.autocast(tc.bfloat16)), (torch, F, torch.autocast("cpu", torch.bfloat16))]:
        p = _leaves(params, lib)
        with auto:
            logits, loss = _mlp(lib, f, p, lib.tensor(x), lib.tensor(y))
        loss.backward()
        outs[lib] = logits, loss, {k: v.grad for k, v in p.items()}
    (logits, loss, grads), (t_logits, t_loss, t_grads) = outs[tc], outs[torch]
    assert (logits.dtype, loss.dtype) == (tc.bfloat16, tc.float32)
    assert (t_logits.dtype, t_loss.dtype) == (torch.bfloat16, torch.float32)
    np.testing.assert_allclose(_np(logits), _np(t_logits), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_np(loss), _np(t_loss), rtol=RTOL, atol=ATOL)
    for k in params:
        assert grads[k].dtype == tc.float32 and t_grads[k].dtype == torch.float32, k
        np.testing.assert_allclose(_np(grads[k]), _np(t_grads[k]), rtol=5e-2, atol=2e-2, err_msg=k)


def _block_params(rng, d=32):
    shapes = [("ln1_w", (d,)), ("ln1_b", (d,)), ("qkv", (3 * d, d)), ("out", (d, d)),
              ("ln2_w", (d,)), ("ln2_b", (d,)), ("fc1", (4 * d, d)), ("fc2", (d, 4 * d))]
    return {k: (1 + 0.1 * rng.standard_normal(s) if k.endswith("_w") else 0.15 * rng.standard_normal(s))
            .astype(np.float32) for k, s in shapes}


def _block(m, f, p, x, heads=4):
    """A pre-norm GPT block: what each op returns under autocast is checked after it."""
    n, t, d = x.shape
    h = f.layer_norm(x, (d,), p["ln1_w"], p["ln1_b"])
    q, k, v = f.linear(h, p["qkv"]).reshape(n, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4).unbind(0)
    a = f.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + f.linear(a.transpose(1, 2).reshape(n, t, d), p["out"])
    h = f.layer_norm(x, (d,), p["ln2_w"], p["ln2_b"])
    x = x + f.linear(f.gelu(f.linear(h, p["fc1"])), p["fc2"])
    return a, x


def test_attention_block_eager_as_torch():
    rng = np.random.default_rng(2)
    params, x = _block_params(rng), rng.standard_normal((2, 8, 32)).astype(np.float32)
    outs = {}
    for lib, f, auto in [(tc, tF, tc.autocast(tc.bfloat16)), (torch, F, torch.autocast("cpu", torch.bfloat16))]:
        p = _leaves(params, lib)
        with auto:
            a, out = _block(lib, f, p, lib.tensor(x))
        (out.float() ** 2).mean().backward()
        outs[lib] = a, out, {k: v.grad for k, v in p.items()}
    (a, out, grads), (ta, t_out, t_grads) = outs[tc], outs[torch]
    assert (a.dtype, out.dtype) == (tc.bfloat16, tc.float32)
    assert (ta.dtype, t_out.dtype) == (torch.bfloat16, torch.float32)
    np.testing.assert_allclose(_np(out), _np(t_out), rtol=RTOL, atol=5e-2)
    for k in params:
        assert grads[k].dtype == tc.float32, k
        np.testing.assert_allclose(_np(grads[k]), _np(t_grads[k]), rtol=0.1, atol=3e-2, err_msg=k)


def test_trace_records_casts_and_keys_programs_by_autocast_state():
    rng = np.random.default_rng(3)
    params, x = _block_params(rng), rng.standard_normal((2, 8, 32)).astype(np.float32)
    p = {k: tc.tensor(v) for k, v in params.items()}
    f = tc.trace(lambda x: _block(tc, tF, p, x)[1])
    plain = f(x)
    with tc.autocast(tc.bfloat16):
        mixed = f(x)
        assert "bf16" in f.lower(x).as_text("graph")
        with tc.autocast(enabled=False):
            np.testing.assert_array_equal(_np(f(x)), _np(plain))
        with tc.autocast(tc.bfloat16):
            eager = _block(tc, tF, p, tc.tensor(x))[1]
    assert "bf16" not in f.lower(x).as_text("graph")
    assert len(f._cache) == 2                    # one program per autocast state, each reused
    np.testing.assert_allclose(_np(mixed), _np(eager), rtol=1e-2, atol=1e-2)
    assert np.abs(_np(mixed) - _np(plain)).max() > 0      # the bfloat16 program really ran


def test_grad_flows_through_the_casts_to_float32_leaves():
    rng = np.random.default_rng(4)
    params, x, y = _mlp_params(rng), rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 10, 8)

    def loss(p, x):
        with tc.autocast(tc.bfloat16):
            return _mlp(tc, tF, p, x, tc.tensor(y))[1]

    p = {k: tc.tensor(v) for k, v in params.items()}
    eager = tc.grad(loss)(p, x)
    traced = tc.trace(tc.grad(loss))(p, x)
    tp = _leaves(params, torch)
    with torch.autocast("cpu", torch.bfloat16):
        _, t_loss = _mlp(torch, F, tp, torch.tensor(x), torch.tensor(y))
    t_loss.backward()
    for k in params:
        assert eager[k].dtype == traced[k].dtype == tc.float32, k
        np.testing.assert_allclose(_np(eager[k]), _np(tp[k].grad), rtol=5e-2, atol=2e-2, err_msg=k)
        np.testing.assert_allclose(_np(traced[k]), _np(eager[k]), rtol=2e-2, atol=1e-2, err_msg=k)


def test_nesting_and_state():
    a = tc.ones(2, 2)
    assert not tc.is_autocast_enabled()
    with tc.autocast(tc.float16):
        assert tc.get_autocast_dtype() == tc.float16
        with tc.autocast(dtype=tc.bfloat16):
            assert (a @ a).dtype == tc.bfloat16
            with tc.autocast(enabled=False):
                assert (a @ a).dtype == tc.float32 and not tc.is_autocast_enabled()
            assert (a @ a).dtype == tc.bfloat16
        assert (a @ a).dtype == tc.float16
    with tc.autocast("cpu", dtype=tc.bfloat16, enabled=False):
        assert (a @ a).dtype == tc.float32
    assert tc.get_autocast_dtype() is None

    @tc.autocast()
    def f(x):
        return x @ x
    assert f(a).dtype == tc.bfloat16 and (a @ a).dtype == tc.float32


def test_float64_and_integers_are_not_narrowed():
    d = tc.ones(2, 2, dtype=tc.float64)
    with tc.autocast(tc.bfloat16):
        assert (d @ d).dtype == tc.float64
        assert tc.cat([tc.ones(2, dtype=tc.int64), tc.ones(2, dtype=tc.int64)]).dtype == tc.int64


def test_bad_arguments_are_named():
    with pytest.raises(DTypeError, match="tc.autocast: dtype must be tc.bfloat16 or tc.float16"):
        tc.autocast(tc.float32)
    with pytest.raises(DTypeError, match="got 'tpu'"):
        tc.autocast("tpu")
    with pytest.raises(ArgumentError, match="a device type"):
        tc.autocast(tc.float16, dtype=tc.bfloat16)
    with pytest.raises(ArgumentError, match="enabled"):
        tc.autocast(enabled="yes")


def test_table_rejects_an_unknown_policy(tmp_path):
    path = tmp_path / "ops.yaml"
    path.write_text("- func: f(Tensor self) -> Tensor\n  autocast: half\n  kind: matmul\n")
    with pytest.raises(TableError, match="'autocast' must be one of lower, fp32, promote"):
        load_table(path)


def test_a_model_argument_takes_the_program_of_the_autocast_state(caplog):
    """A whole tc.nn model as an argument (tc.trace's fast path keys it too)."""
    m = tc.nn.Sequential(tc.nn.Linear(8, 16), tc.nn.ReLU(), tc.nn.Linear(16, 4))
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    f = tc.trace(lambda m, x: m(x))
    assert [f(m, x).dtype for _ in range(2)] == [tc.float32] * 2
    with caplog.at_level("INFO", logger="tracecomp.transforms.trace"), tc.autocast():
        assert [f(m, x).dtype for _ in range(2)] == [tc.bfloat16] * 2
    assert "tc.autocast's state" in caplog.text
    assert f(m, x).dtype == tc.float32 and len(f._cache) == 2
