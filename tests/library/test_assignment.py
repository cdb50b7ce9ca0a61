"""Item assignment (`x[index] = value`), functionalized: against PyTorch eagerly, in tc.trace,
in gradients, and its errors (views, leaves that require grad, saved values changed)."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle)")

X = np.arange(3 * 4, dtype=np.float64).reshape(3, 4) / 3

CASES = [
    ("an element", lambda T: (1, 2), 7.5),
    ("a row", lambda T: 0, np.array([1.0, 2.0, 3.0, 4.0])),
    ("a column, broadcast", lambda T: (slice(None), 1), np.array(-1.0)),
    ("a strided slice", lambda T: (slice(None, None, 2), slice(1, 3)), 9.0),
    ("negative and None", lambda T: (-1, None, slice(-2, None)), np.array([[5.0, 6.0]])),
    ("index tensors", lambda T: (T(np.array([0, 2])), T(np.array([3, -4]))), np.array([10.0, 20.0])),
    ("a mask", lambda T: T(X > 2), 0.0),
    ("a mask over rows, a row each", lambda T: T(np.array([True, False, True])), np.array([7.0, 8.0, 9.0, 1.0])),
    ("a mask, one value per pick", lambda T: T(X < 1), np.array([4.0, 5.0, 6.0])),
    ("an int value into floats", lambda T: (2, 0), 3),
]


def _index(build, lib):
    return build((lambda a: tc.tensor(a)) if lib == "tc" else (lambda a: torch.from_numpy(a)))


def _value(v, lib):
    return (tc.tensor(v) if lib == "tc" else torch.from_numpy(v)) if isinstance(v, np.ndarray) else v


@pytest.mark.parametrize("desc, build, value", CASES, ids=[c[0] for c in CASES])
def test_eager_matches_torch(desc, build, value):
    want = torch.from_numpy(X.copy())
    want[_index(build, "torch")] = _value(value, "torch")
    got = tc.tensor(X.copy())
    got[_index(build, "tc")] = _value(value, "tc")
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# A mask whose picks all get the same value is a `where` (its shape does not depend on the
# mask's values); one value per pick needs the mask's count.
TRACEABLE = [c for c in CASES if "per pick" not in c[0]]


@pytest.mark.parametrize("desc, build, value", TRACEABLE, ids=[c[0] for c in TRACEABLE])
def test_traced_matches_torch(desc, build, value):
    want = torch.from_numpy(X.copy())
    want[_index(build, "torch")] = _value(value, "torch")

    def fn(x):
        y = x * 1.0
        y[_index(build, "tc")] = _value(value, "tc")
        return y
    np.testing.assert_array_equal(tc.trace(fn)(X).numpy(), want.numpy())


def test_a_value_per_masked_element_in_a_trace_says_why_it_cannot_trace():
    def fn(x):
        y = x * 1.0
        y[x < 1] = tc.tensor([4.0, 5.0, 6.0])
        return y
    with pytest.raises(tc.TraceError, match=r"x\[mask\]"):
        tc.trace(fn)(X)


def test_index_put_accumulates_through_a_mask_and_refuses_a_dtype_mismatch():
    mask, v = np.array([True, False, True]), np.array([1.0, 2.0, 3.0, 4.0])
    want = torch.from_numpy(X).index_put((torch.from_numpy(mask),), torch.from_numpy(v), accumulate=True)
    got = tc.trace(lambda x, m, v: x.index_put((m,), v, accumulate=True))(X, mask, v)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(tc.DTypeError, match="index_put: values have dtype float32 but self has float64"):
        tc.index_put(tc.tensor(X), [tc.tensor(np.array([0]))], tc.tensor(np.float32(1)))


def test_gradients_flow_to_the_value_and_around_the_overwritten_elements():
    w = np.random.default_rng(0).uniform(0.5, 1.5, (3, 4))
    xt, vt = torch.from_numpy(X.copy()).requires_grad_(), torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = xt * 2
    y[1, 1:3] = vt * vt
    want = torch.autograd.grad((y * torch.from_numpy(w)).sum(), [xt, vt])

    def loss(x, v):
        y = x * 2
        y[1, 1:3] = v * v
        return (y * tc.tensor(w)).sum()
    for grad in (tc.grad(loss, argnums=(0, 1)), tc.trace(tc.grad(loss, argnums=(0, 1)))):
        got = grad(tc.tensor(X), tc.tensor(np.array([2.0, 3.0])))
        for g, e in zip(got, want):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12)


def test_assigning_into_an_indexed_view_reaches_its_base_as_in_pytorch():
    for lib, make in (("tc", lambda a: tc.tensor(a)), ("torch", lambda a: torch.from_numpy(a))):
        x = make(X.copy())
        x[0][1] = 5.0
        y = x[1:]
        y += 1
        y[0, 0] = -2.0
        x[2, ::2] *= 3
        if lib == "tc":
            got = x.numpy()
        else:
            want = x.numpy()
    np.testing.assert_array_equal(got, want)


def test_a_view_taken_before_its_base_changed_raises_when_used():
    x = tc.tensor(X.copy())
    y = x[1]
    x[1, 0] = 7.0                     # PyTorch's y would now read 7
    for use in (lambda: y + 1, lambda: y.numpy(), lambda: y.__setitem__(0, 1.0)):
        with pytest.raises(tc.ArgumentError, match="changed in place since"):
            use()
    np.testing.assert_array_equal(x[1].numpy()[:1], [7.0])     # indexing again is fine


def test_assigning_into_other_views_raises_instead_of_missing_the_base():
    x = tc.tensor(X.copy())
    with pytest.raises(tc.ArgumentError, match=r"view op \(reshape, transpose") as info:
        x.T[0, 1] = 5.0
    assert "test_assignment.py" in str(info.value)
    y = x.clone()
    y[0, 1] = 5.0                     # a clone is a tensor of its own
    assert x.numpy()[0, 1] == X[0, 1] and y.numpy()[0, 1] == 5.0
    z = x[tc.tensor(np.array([0, 2]))]    # advanced indexing copies, as in PyTorch
    z[0, 0] = -1.0
    assert x.numpy()[0, 0] == X[0, 0]


def test_a_leaf_that_requires_grad_cannot_be_assigned_into():
    x = tc.tensor(X.copy(), requires_grad=True)
    with pytest.raises(tc.TracecompError, match="leaf tensor that requires grad"):
        x[0, 0] = 1.0
    with tc.no_grad():
        x[0, 0] = 1.0
    assert x.numpy()[0, 0] == 1.0


def test_changing_a_saved_value_makes_backward_raise():
    x = tc.tensor(X.copy(), requires_grad=True)
    y = x.exp()                       # exp's backward reads its result
    y[0, 0] = 0.0
    with pytest.raises(tc.TracecompError, match="modified by an inplace operation.*version 1; expected version 0"):
        y.sum().backward()
    z = x * 2                         # mul by a number reads no saved tensor of z
    z[0, 0] = 0.0
    z.sum().backward()
    expected = np.full(X.shape, 2.0)
    expected[0, 0] = 0.0
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_bad_values_name_the_problem():
    x = tc.tensor(X.copy())
    with pytest.raises(tc.ShapeError, match="broadcast"):
        x[0] = np.array([1.0, 2.0, 3.0])
    with pytest.raises(tc.ShapeError, match="out of bounds"):
        x[tc.tensor(np.array([5]))] = 1.0


def test_in_place_operators_follow_pytorch():
    for lib, make in (("tc", lambda a: tc.tensor(a)), ("torch", lambda a: torch.from_numpy(a))):
        x = make(X.copy())
        alias = x
        x += 1
        x *= make(np.arange(4.0))
        x[1] /= 2
        i = make(np.arange(4))
        i //= 2
        result = (alias.numpy(), i.numpy())
        if lib == "tc":
            got = result
        else:
            want = result
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    i = tc.tensor(np.arange(3))
    with pytest.raises(tc.DTypeError, match="can't be cast"):
        i += 0.5
    x = tc.tensor(X.copy())
    with pytest.raises(tc.ShapeError, match="cannot broadcast"):
        x[0] += tc.ones(2, 4)


def test_in_place_operators_trace():
    def fn(x):
        y = x * 1.0
        y[0] += 10.0
        y *= 2
        return y
    want = X * 2
    want[0] += 20
    np.testing.assert_array_equal(tc.trace(fn)(X).numpy(), want)


@pytest.mark.parametrize("backend", ["cpu", "interp"])
def test_changes_to_arguments_inside_a_trace_reach_the_caller_as_eagerly(backend):
    def fn(m, state, a):
        m[0] = 5.0                  # item assignment into a Tensor argument
        state["count"] += 1         # an in-place operator on an argument inside a pytree
        row = a[1]
        row *= 2                    # a view made by indexing writes into its base, an array
        return m.sum()

    def arguments():
        return tc.zeros(3), {"count": tc.tensor(np.array([1, 2]))}, np.arange(4.0).reshape(2, 2)

    want = arguments()
    eager = fn(*want)
    traced = tc.trace(fn, backend=backend)
    for call in range(2):           # the second call takes the cached signature's fast path
        got = arguments()
        result = traced(*got) if call == 0 else traced(got[0], got[1], a=got[2])
        np.testing.assert_array_equal(result.numpy(), eager.numpy())
        np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
        np.testing.assert_array_equal(got[1]["count"].numpy(), [2, 3])
        np.testing.assert_array_equal(got[2], want[2])
        assert got[0]._version == 1


def test_a_traced_step_that_updates_its_argument_in_place_keeps_updating_it():
    def step(p, g):
        p -= 0.5 * g
        return p * 1
    p = np.ones(3, np.float32)
    stepped = tc.trace(step, donate_argnums=0)
    for _ in range(3):
        out = stepped(p, np.ones(3, np.float32))
    np.testing.assert_array_equal(p, [-0.5] * 3)
    np.testing.assert_array_equal(out.numpy(), p)


def test_a_trace_refuses_in_place_changes_eager_refuses_and_export_refuses_them_all(tmp_path):
    def fn(m):
        m[0] = 1.0
        return m * 2
    with pytest.raises(tc.TracecompError, match="leaf tensor that requires grad"):
        tc.trace(fn)(tc.tensor(np.zeros(2), requires_grad=True))
    read_only = np.zeros(2)
    read_only.flags.writeable = False
    with pytest.raises(tc.ArgumentError, match="argument 0 .*cannot be written"):
        tc.trace(fn)(read_only)
    with pytest.raises(tc.ArgumentError, match="changes its argument.*0 in place"):
        tc.export(fn, [np.zeros(2)], str(tmp_path / "fn.so"))
