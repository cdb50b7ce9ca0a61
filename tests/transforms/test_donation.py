"""tc.trace(fn, donate_argnums=...): outputs reuse donated input buffers only where safe."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc


def _arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _run(fn, args, donate):
    """The donating call's result (and the donated arrays after it) next to a plain call's."""
    want = [np.asarray(r) for r in _flat(tc.trace(fn)(*[a.copy() for a in args]))]
    got = tc.trace(fn, donate_argnums=donate)(*args)
    return want, [np.asarray(r) for r in _flat(got)], got


def _flat(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def test_sgd_update_writes_into_the_donated_weights():
    w, g = _arrays((64, 32), (64, 32))
    pointer = w.ctypes.data
    want, [got], _ = _run(lambda w, g: w - 0.1 * g, [w, g], donate=0)
    np.testing.assert_array_equal(got, want[0])
    assert got.ctypes.data == pointer and np.shares_memory(got, w)
    np.testing.assert_array_equal(w, want[0])          # the caller's array holds the output


def test_donated_tensor_holds_the_output_and_repeated_calls_stay_right():
    w0, g = _arrays((100,), (100,))
    step = tc.trace(lambda w, g: (w * 0.5 + g).tanh(), donate_argnums=(0,))
    w = tc.tensor(w0.copy())
    expect = w0.copy()
    for _ in range(3):
        w = step(w, g)
        expect = np.tanh(expect * 0.5 + g)
    np.testing.assert_allclose(np.asarray(w), expect, rtol=1e-5, atol=1e-6)


def test_nothing_is_reused_without_donation():
    w, g = _arrays((16,), (16,))
    got = tc.trace(lambda w, g: w - g)(w, g)
    assert not np.shares_memory(np.asarray(got), w) and not np.shares_memory(np.asarray(got), g)


@pytest.mark.parametrize("fn", [lambda x: x.T + 1,                      # reads another element
                                lambda x: (x + 1, x.sum(1)),            # a reduction reads x after
                                lambda x: tc.cat([x[:, 1:], x[:, :1]], 1) + x],   # shifted elements
                         ids=["transpose", "sum-after", "shifted"])
def test_unsafe_reuse_falls_back_to_a_fresh_output(fn):
    [x] = _arrays((8, 8))
    before = x.copy()
    want, got, _ = _run(fn, [x], donate=0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert not np.shares_memory(got[0], x)
    np.testing.assert_array_equal(x, before)


def test_reduction_read_before_the_writer_allows_reuse():
    [x] = _arrays((8, 8))
    want, [got], _ = _run(lambda x: x * 2 + x.sum(0), [x], donate=0)    # the sum runs first
    np.testing.assert_allclose(got, want[0], rtol=1e-6)
    assert np.shares_memory(got, x)


def test_donated_input_also_read_by_a_later_output():
    x, y = _arrays((32,), (32,))
    fn = lambda x, y: (x + y, x * 3)     # noqa: E731
    lowered = tc.trace(fn, donate_argnums=0).lower(x, y)
    want, got, _ = _run(fn, [x.copy(), y], donate=0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    # whichever output writes into x, the other output's reads of x must come first
    assert len(lowered.reused_inputs) <= 1


def test_matmul_epilogue_reading_the_donated_input_does_not_reuse_it():
    x, w, g = _arrays((64, 48), (48, 40), (64, 40))
    want, [got], _ = _run(lambda x, w, g: g - 0.01 * (x @ w), [x, w, g], donate=2)
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)
    assert not np.shares_memory(got, g)


def test_matmul_output_reuses_a_donated_input_it_does_not_read():
    x, w, old = _arrays((64, 48), (48, 40), (64, 40))
    fn = lambda x, w, old: x @ w     # noqa: E731
    want, [got], _ = _run(fn, [x, w, old], donate=2)
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)
    assert np.shares_memory(got, old)


def test_same_array_passed_twice_is_not_corrupted():
    [x] = _arrays((16, 16))
    expect = x + (x * 2).T
    got = tc.trace(lambda a, b: a + (b * 2).T, donate_argnums=0)(x, x)
    np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-6)


def test_read_only_and_non_contiguous_donations_are_copied_not_written():
    [base] = _arrays((8, 8))
    strided = base[:, ::2]
    frozen = base.copy()
    frozen.flags.writeable = False
    for x in (strided, frozen):
        before = x.copy()
        got = tc.trace(lambda x: x + 1, donate_argnums=0)(x)
        np.testing.assert_allclose(np.asarray(got), before + 1)
        np.testing.assert_array_equal(x, before)


def test_pytree_argument_donates_every_leaf():
    w1, w2, g = _arrays((10,), (10,), (10,))
    step = tc.trace(lambda p, g: {"a": p["a"] - g, "b": p["b"] - g}, donate_argnums=0)
    out = step({"a": w1, "b": w2}, g)
    assert np.shares_memory(np.asarray(out["a"]), w1) and np.shares_memory(np.asarray(out["b"]), w2)


def test_bad_donate_argnums_raise_clear_errors():
    x = np.ones(4, np.float32)
    with pytest.raises(tc.ArgumentError, match="donate_argnums has 3, but the call passes 1"):
        tc.trace(lambda x: x + 1, donate_argnums=3)(x)
    with pytest.raises(tc.ArgumentError, match="argument 1 is donated .* holds no tensor"):
        tc.trace(lambda x, s: x * s, donate_argnums=(1,))(x, 2.0)
    with pytest.raises(tc.ArgumentError, match="non-negative"):
        tc.trace(lambda x: x, donate_argnums=(-1,))
    with pytest.raises(tc.ArgumentError, match="non-negative"):
        tc.trace(lambda x: x, donate_argnums="0")


def test_interpreter_ignores_donation():
    [x] = _arrays((8,))
    before = x.copy()
    got = tc.trace(lambda x: x + 1, backend="interp", donate_argnums=0)(x)
    np.testing.assert_allclose(np.asarray(got), before + 1)
    np.testing.assert_array_equal(x, before)


FUNCTIONS = {
    "pointwise-chain": lambda x, y: (x * y + 1).tanh() - x,
    "broadcast-row": lambda x, y: x + y[0],
    "two-outputs": lambda x, y: (x + 1, y * x),
    "transpose-other": lambda x, y: x + y.T,
    "softmax": lambda x, y: tc.softmax(x, 1) * y,
    "layernorm": lambda x, y: tc.layer_norm(x, (8,)) + y,
    "reduction-then-pointwise": lambda x, y: x - x.mean(1, keepdim=True) + y,
    "matmul-epilogue": lambda x, y: (x @ y).relu() + x,
    "matmul-reads-later": lambda x, y: (x @ y, x + y),
    "cat-shift": lambda x, y: tc.cat([x[:, 1:], y[:, :1]], 1) + y,
    "swap": lambda x, y: (y, x),
    "same-value-twice": lambda x, y: (x + y, x + y),
    "cumulative": lambda x, y: (x + y, (x + y).sum(0), x * 2),
}


@pytest.mark.parametrize("donate", [(0,), (1,), (0, 1)], ids=["x", "y", "both"])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_donating_never_changes_results(name, donate):
    x, y = _arrays((8, 8), (8, 8), seed=len(name))
    fn = FUNCTIONS[name]
    want = [np.asarray(r) for r in _flat(tc.trace(fn, backend="interp")(x.copy(), y.copy()))]
    f = tc.trace(fn, donate_argnums=donate)
    for _ in range(2):                        # the second call takes the fast path
        args = [x.copy(), y.copy()]
        got = [np.asarray(r) for r in _flat(f(*args))]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        for i, a in enumerate(args):          # an argument changed only if an output took it over
            if not any(np.shares_memory(a, g) for g in got):
                np.testing.assert_array_equal(a, (x, y)[i])


def test_chained_assignments_update_one_buffer_instead_of_copying_it():
    def assign(a, i):
        y = a * 2
        y[i] = 1.0
        y[0] = 5.0
        y[1:3] += 7.0
        return y
    a, i = np.arange(8.0), np.array([2, 5])
    want = a * 2
    want[i] = 1.0
    want[0] = 5.0
    want[1:3] += 7.0
    np.testing.assert_array_equal(tc.trace(assign)(a, i).numpy(), want)
    program = tc.trace(assign).lower(a, i).program
    temps = [n for n, b in program.buffers.items() if b.role == "temp" and b.shape == (8,)]
    assert temps == [], f"every assignment should update the one buffer, got temps {temps}"
    assert len(program.kernels) == 4        # y[1:3] += 7 is one update (a read and a scatter)


def test_a_value_read_after_the_update_keeps_its_copy():
    def assign(a):
        y = a * 2
        z = y.clone()
        z[0] = 5.0
        return z, y.sum()
    a = np.arange(8.0)
    z, s = tc.trace(assign)(a)
    assert z.numpy()[0] == 5.0 and float(s) == 56.0
