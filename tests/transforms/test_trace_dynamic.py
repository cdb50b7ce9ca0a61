"""tc.trace(dynamic=...): one compile for many sizes (issue 36).

Every traced result is compared with eager execution (itself tested against NumPy
elsewhere), and the compiles are counted as the traced function's signatures."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import tracecomp as tc
from tracecomp import nn
from tracecomp.core.symbolic import Dim, DynamicShapeError
from tracecomp.tensors import pytree

SIZES = (3, 5, 17, 2, 40)


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _eager(fn, *args):
    return fn(*[tc.tensor(a) if isinstance(a, np.ndarray) else a for a in args])


def _close(got, want, rtol=2e-5, atol=2e-6):
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _leaves(tree) -> list[np.ndarray]:
    leaves, _ = pytree.flatten(tree, lambda x: isinstance(x, (tc.Tensor, np.ndarray, np.generic, float)))
    return [np.asarray(x) for x in leaves]


CASES = {
    "elementwise": (lambda x, y: (x * 2.0 + y).exp() - y.tanh(), lambda r, n: (_f32(r, 4, n), _f32(r, n))),
    "reductions": (lambda x: (x.sum(1), x.max(0), x.mean(), x.var(1)), lambda r, n: (_f32(r, n, n + 3),)),
    "matmul": (lambda a, b: a @ b, lambda r, n: (_f32(r, n, 24), _f32(r, 24, 16))),
    "batched_matmul": (lambda a, b: a @ b, lambda r, n: (_f32(r, 6, n, 8), _f32(r, 6, 8, n))),
    "softmax": (lambda x: tc.softmax(x, -1) + tc.log_softmax(x, 0), lambda r, n: (_f32(r, 6, n),)),
    "reshape": (lambda x: x.reshape(-1, 2).sum(1) + x.reshape(x.shape[0] * 2, 2)[:, 0],
                lambda r, n: (_f32(r, n, 4),)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dynamic", [None, True])
def test_one_compile_serves_every_size(case, dynamic):
    fn, make = CASES[case]
    f = tc.trace(fn, dynamic=dynamic)
    rng = np.random.default_rng(0)
    for n in SIZES:
        args = make(rng, n)
        _close(f(*args), _eager(fn, *args))
    if dynamic and case == "reshape":
        # every dim dynamic: x.reshape(-1, 2) of an [s0, s1] x cannot know that s0*s1 is even,
        # so each shape compiles (the changed dim alone, as None does, would do)
        assert len(f.signatures) == len(SIZES)
        return
    # None: the first size, then one program with the changed dims dynamic; True: dynamic at once
    assert len(f.signatures) == (2 if dynamic is None else 1)
    assert f.lower(*make(rng, 9)).dynamic


def test_false_compiles_every_shape():
    fn, make = CASES["elementwise"]
    f = tc.trace(fn, dynamic=False)
    rng = np.random.default_rng(1)
    for n in SIZES:
        args = make(rng, n)
        _close(f(*args), _eager(fn, *args))
    assert len(f.signatures) == len(SIZES)
    assert not any(f.lower(*make(rng, n)).dynamic for n in SIZES)


def test_sizes_0_and_1_keep_compiles_of_their_own():
    fn = CASES["elementwise"][0]
    f = tc.trace(fn)
    rng = np.random.default_rng(2)
    for n, compiles in [(3, 1), (5, 2), (1, 3), (0, 4), (7, 4), (1, 4), (0, 4), (12, 4)]:
        args = (_f32(rng, 4, n), _f32(rng, n))
        _close(f(*args), _eager(fn, *args))
        assert len(f.signatures) == compiles, n
    assert not f.lower(_f32(rng, 4, 1), _f32(rng, 1)).dynamic


def test_the_log_says_which_dims_became_dynamic(caplog):
    f = tc.trace(lambda x, k: x * k)
    with caplog.at_level(logging.INFO, logger="tracecomp.transforms.trace"):
        f(np.ones((2, 7), np.float32), 2)
        f(np.ones((2, 8), np.float32), 2)
        f(np.ones((2, 9), np.float32), 2)
        f(np.ones((3, 9), np.float32), 2)
    assert "x axis 1 became dynamic (s0): 7 then 8" in caplog.text
    # the batch changes too: a compile with both dims dynamic (axis 1 stays one)
    assert "x axis 0 became dynamic (s0): 2 then 3; x axis 1 is dynamic (s1)" in caplog.text
    assert len(f.signatures) == 3


def test_duck_sizing_shares_a_size_and_splits_it_when_it_differs():
    """Equal sizes that change together share one symbol (x @ y needs x's columns to be
    y's rows); a later call where the sizes differ compiles once more, with two symbols."""
    fn = lambda x, y: x @ y + x.sum()          # noqa: E731
    f = tc.trace(fn)
    rng = np.random.default_rng(3)
    for n, m in [(4, 4), (6, 6), (9, 9), (9, 5), (3, 7), (8, 8)]:
        args = (_f32(rng, n, m), _f32(rng, m, n))
        _close(f(*args), _eager(fn, *args), rtol=1e-4, atol=1e-4)
    assert len(f.signatures) == 3


def test_an_mlp_with_a_varying_batch():
    tc.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 5))
    f = tc.trace(lambda x: tc.softmax(model(x), -1))
    rng = np.random.default_rng(4)
    for b in (64, 64, 17, 64, 3, 128, 2):
        x = _f32(rng, b, 20)
        _close(f(x), tc.softmax(model(tc.tensor(x)), -1).numpy())
    assert len(f.signatures) == 2


def test_gradients_at_a_varying_batch():
    rng = np.random.default_rng(5)
    w1, b1, w2 = _f32(rng, 12, 16) * 0.3, _f32(rng, 16) * 0.1, _f32(rng, 16, 5) * 0.3

    def loss(w1, b1, w2, x, y):
        logits = (x @ w1 + b1).tanh() @ w2
        return -(tc.log_softmax(logits, -1) * y).sum() / x.shape[0] + 0.01 * (logits ** 2).mean()
    step = tc.value_and_grad(loss, argnums=(0, 1, 2))
    f = tc.trace(step)
    for n in (8, 11, 32, 8, 5):
        x, y = _f32(rng, n, 12), np.eye(5, dtype=np.float32)[rng.integers(0, 5, n)]
        (value, grads), (v_want, g_want) = f(w1, b1, w2, x, y), _eager(step, w1, b1, w2, x, y)
        _close(value, v_want, rtol=1e-5, atol=1e-6)
        _close(grads, g_want, rtol=1e-4, atol=1e-6)
    assert len(f.signatures) == 2


def test_a_transformer_decodes_a_growing_sequence_with_two_compiles():
    """Issue 36's case: the GPT demo's model, greedy decoding, every step on the whole
    sequence so far: 32 lengths, 2 compiles (length 1, then one dynamic program)."""
    from tracecomp.demo.gpt import GPT
    tc.manual_seed(0)
    model = GPT(64, 40, 32, 4, 2)
    model.eval()
    f = tc.trace(lambda ids: model(ids))
    ids = np.zeros((1, 1), np.int64)
    for t in range(1, 33):
        logits = f(ids).numpy()
        if t in (1, 2, 7, 32):
            np.testing.assert_allclose(logits, model(tc.tensor(ids)).numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"length {t}")
        ids = np.concatenate([ids, [[int(np.argmax(logits[0, -1]))]]], axis=1)
    assert len(f.signatures) == 2
    # batches of sequences: the batch size changes too, one more compile for every batch and length
    for b, t in ((3, 5), (3, 6), (2, 9), (5, 1)):
        batch = np.random.default_rng(t).integers(0, 64, (b, t))
        np.testing.assert_allclose(f(batch).numpy(), model(tc.tensor(batch)).numpy(), rtol=1e-4, atol=1e-5)
    assert len(f.signatures) == 4          # (5, 1): a length of 1 has a compile of its own


def test_named_dims_are_dynamic_from_the_first_call_and_checked():
    fn = lambda x, mask: tc.softmax(x.masked_fill(mask, -1e9), -1)        # noqa: E731
    f = tc.trace(fn, dynamic={"x": {1: "seq"}, "mask": {1: "seq"}})
    rng = np.random.default_rng(6)
    for t in (4, 9, 2):
        x, mask = _f32(rng, 3, t), rng.random((3, t)) < 0.3
        _close(f(x, mask), _eager(fn, x, mask))
    assert len(f.signatures) == 1
    assert [v.type.shape[1] for v in f.lower(x, mask).graph.inputs] == [Dim.named("seq", 1)] * 2
    with pytest.raises(tc.ArgumentError, match=r"mask axis 1 must be seq = 4 \(seq from x axis 1\), got 5"):
        f(_f32(rng, 3, 4), rng.random((3, 5)) < 0.3)
    # by keyword, too
    f2 = tc.trace(fn, dynamic={"mask": {1: "seq"}, "x": {1: "seq"}})
    _close(f2(x=x, mask=mask), _eager(fn, x, mask))


def test_a_named_dim_the_function_cannot_take_raises():
    f = tc.trace(lambda x: x.reshape(2, -1) if x.shape[0] > 4 else x, dynamic={"x": {0: "n"}})
    with pytest.raises(DynamicShapeError, match=r"tc.trace\(<lambda>\): the dynamic sizes .* cannot flow"):
        f(np.ones(6, np.float32))


def test_a_function_that_branches_on_a_size_keeps_the_branch_as_a_guard(caplog):
    """`x.shape[0] > 4` is answered at the call's size while tracing with dynamic sizes, and
    kept as a guard (PyTorch's): the dynamic compile serves the sizes on its side only."""
    def fn(x):
        if x.shape[0] > 4:                 # a size read as a number
            return x * 2.0
        return x + 1.0
    f = tc.trace(fn)
    rng = np.random.default_rng(7)
    with caplog.at_level(logging.INFO, logger="tracecomp.transforms.trace"):
        for n in (3, 6, 2, 9, 4, 12):
            x = _f32(rng, n)
            _close(f(x), _eager(fn, x))
    # 3: its own; 6: dynamic, guarded by s0 > 4 (9 and 12 reuse it); 2 and 4: their own
    assert len(f.signatures) == 4
    assert "tracing with dynamic sizes failed" not in caplog.text


def test_a_size_compared_with_a_number_guards_the_compile():
    """`x.shape[0] == 8` is False at the sizes of the dynamic compile: it serves every size
    but 8, which compiles its own program (PyTorch's guard)."""
    def fn(x):
        return x * 2.0 if x.shape[0] == 8 else x + 1.0
    f = tc.trace(fn)
    rng = np.random.default_rng(8)
    for n in (3, 5, 8, 9, 8, 30):
        x = _f32(rng, n)
        _close(f(x), _eager(fn, x))
    assert len(f.signatures) == 3


def test_index_arguments_and_computed_indices_are_checked_at_every_size():
    f = tc.trace(lambda x, i: x[i] + x[0])
    rng = np.random.default_rng(9)
    for n in (4, 6, 11):
        x, i = _f32(rng, n, 3), rng.integers(0, n, 5)
        _close(f(x, i), x[i] + x[0])
    assert len(f.signatures) == 2
    with pytest.raises(tc.ShapeError, match="index 11 is out of bounds for dim 0 with size 11"):
        f(_f32(rng, 11, 3), np.array([0, 11]))
    g = tc.trace(lambda x, k: x[k[0] * 2])           # a computed index: checked in the kernel
    for n in (4, 6, 11):
        x = _f32(rng, n)
        _close(g(x, np.array([1])), x[2])
    with pytest.raises(tc.ShapeError, match="out of bounds for dim 0 with size s0 = 7"):
        g(_f32(rng, 7), np.array([5]))


def test_outputs_that_are_inputs_repeat_or_change_in_place():
    def fn(x, y):
        y[0] = x.sum()                       # an argument changed in place
        return x, x * 2.0, x * 2.0, {"y": y}
    f = tc.trace(fn)
    rng = np.random.default_rng(10)
    for n in (3, 4, 8):
        x, y = _f32(rng, n), _f32(rng, n)
        ty = tc.tensor(y.copy())
        a, b, c, d = f(x, ty)
        np.testing.assert_array_equal(a.numpy(), x)
        _close((b, c), (x * 2, x * 2))
        assert b is not c
        np.testing.assert_allclose(ty.numpy()[0], x.sum(), rtol=1e-5)
        assert d["y"].shape == (n,)
    assert len(f.signatures) == 2


def test_a_closed_over_tensor_of_another_shape_retraces_the_dynamic_compile():
    w = tc.tensor(np.ones((4, 3), np.float32))
    f = tc.trace(lambda x: x @ w)
    for n in (3, 5, 6):
        assert f(np.ones((n, 4), np.float32)).shape == (n, 3)
    w = tc.tensor(np.full((4, 2), 2.0, np.float32))         # the global f reads: another shape
    for n in (3, 5, 7):
        np.testing.assert_allclose(f(np.ones((n, 4), np.float32)).numpy(), np.full((n, 2), 8.0))
    assert len(f.signatures) == 3          # (3,), then dynamic; then dynamic again with the new w


def test_dynamic_options_are_checked():
    with pytest.raises(tc.ArgumentError, match="dynamic must be None, True, False or a dict"):
        tc.trace(lambda x: x, dynamic="yes")
    with pytest.raises(tc.ArgumentError, match="dynamic dims run on the CPU backend"):
        tc.trace(lambda x: x, dynamic=True, backend="interp")
    with pytest.raises(tc.ArgumentError, match="the size name must be an identifier"):
        tc.trace(lambda x: x, dynamic={"x": {0: "my batch"}})
    f = tc.trace(lambda x: x * 2, dynamic={"z": {0: "n"}})
    with pytest.raises(tc.ArgumentError, match="'z' is not an argument of <lambda>"):
        f(np.ones(3, np.float32))


def test_the_interpreter_specializes_and_export_lowers_a_static_trace():
    f = tc.trace(lambda x: x * 2.0, backend="interp")
    for n in (3, 4, 5):
        np.testing.assert_allclose(f(np.ones(n, np.float32)).numpy(), 2.0)
    assert len(f.signatures) == 3
    g = tc.trace(lambda x: x * 2.0)
    for n in (3, 4, 5):
        g(np.ones(n, np.float32))
    assert g.lower(np.ones(5, np.float32)).dynamic and not g.lower_baked(np.ones(5, np.float32)).dynamic


def test_sizes_tracecomp_needs_as_numbers_stay_static_the_others_dynamic(caplog):
    """A LayerNorm's normalized size (an int in the module) and attention's head dim are
    fixed, as PyTorch specializes them; batch and sequence stay dynamic: one compile."""
    tc.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
    layer.eval()
    f = tc.trace(lambda x: layer(x, is_causal=True), dynamic=True)
    rng = np.random.default_rng(3)
    with caplog.at_level(logging.INFO, logger="tracecomp.transforms.trace"):
        for b, t in ((2, 5), (3, 7), (4, 9), (2, 12)):
            x = _f32(rng, b, t, 16)
            _close(f(x), layer(tc.tensor(x), is_causal=True), rtol=1e-4, atol=1e-5)
    assert len(f.signatures) == 1
    assert "x axis 2 stay static" in caplog.text
    (lowered,) = f._cache.values()
    assert lowered.dynamic
    with pytest.raises(tc.ShapeError, match="layer_norm"):
        f(_f32(rng, 2, 5, 8))       # another width is another compile, which the model refuses


def test_a_linear_on_dynamic_batch_and_sequence_is_one_packed_product():
    """(batch, seq, k) @ (k, n) with batch and seq dynamic runs as one product of rows
    (the packed GEMM's Matmul statement), not as loops over a dynamic batch."""
    from tracecomp.lower.loops import ir as L
    f = tc.trace(lambda x, w: tc.relu(x @ w), dynamic=True)
    rng = np.random.default_rng(4)
    w = _f32(rng, 24, 16)
    for b, t in ((2, 3), (5, 7), (3, 40)):
        x = _f32(rng, b, t, 24)
        _close(f(x, w), _eager(lambda x, w: tc.relu(x @ w), x, w), rtol=1e-4, atol=1e-5)
    (lowered,) = f._cache.values()
    assert any(isinstance(s, L.Matmul) for k in lowered.cpu_program.kernels for s in k.body)


def test_large_dynamic_outputs_are_recycled():
    """A dynamic program's large outputs come from the block cache (already faulted in)."""
    from tracecomp.runtime.memory import BlockCache, output_blocks
    f = tc.trace(lambda x: x * 2.0, dynamic=True)
    n = BlockCache.MIN_BYTES // 4 // 64 + 1
    x = np.ones((n, 64), np.float32)
    f(x)                                 # (its output dropped at once: back to the cache)
    before = output_blocks.free_bytes
    assert before > 0
    out = f(x)
    assert output_blocks.free_bytes < before
    np.testing.assert_array_equal(out.numpy(), 2.0)


def test_an_index_put_whose_checks_bound_a_dynamic_size_compiles_once():
    """The index checks' bound (rows * cols, both dynamic) is computed again at the kernel's
    exit: the product the loop computed does not dominate it (LLVM refused the module)."""
    fn = lambda x, r, c, v: tc.index_put(x, [r, c], v)          # noqa: E731
    f = tc.trace(fn, dynamic=True)
    rng = np.random.default_rng(5)
    for n, m in ((3, 5), (4, 6), (6, 8)):
        x = _f32(rng, n, m)
        r, c = np.array([0, n - 1]), np.array([[1], [m - 2]])
        v = _f32(rng, 2, 2)
        _close(f(x, r, c, v), _eager(fn, x, r, c, v))
    assert len(f.signatures) == 1


def test_slices_and_indices_on_a_dynamic_dim_compile_once_under_guards():
    """x[:, 1:3], x[:, :-1], x[-1] and a bounded x[:4] on dynamic dims: the bounds checks are
    answered at the call's sizes and kept as guards, so a size on the other side of one
    (x[:4] of 3 rows: clamped) gets a compile of its own, and the others share one."""
    fn = lambda x: (x[:, 1:3] * 2.0, x[:, :-1].sum(1), x[-1], x[:4])       # noqa: E731
    f = tc.trace(fn, dynamic=True)
    rng = np.random.default_rng(6)
    for n, m in ((5, 6), (7, 9), (12, 4), (3, 8)):
        x = _f32(rng, n, m)
        _close(f(x), _eager(fn, x))
    assert len(f.signatures) == 2         # n >= 4 (three sizes), then n = 3 < 4
