"""tc.vmap: every op of the shared sample table mapped against a Python loop over the items,
eagerly and compiled; in_axes/out_axes and nesting; composition with grad, vjp, jvp and
trace in either order, against torch.func; per-example gradients; randomness; and the
errors for what cannot be mapped."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracecomp as tc
from tables.op_samples import all_samples, leaves

SAMPLES = [s for s in all_samples() if s.inputs and not s.nondeterministic]


SORTED_INPUTS = {"searchsorted.Tensor", "searchsorted.Scalar", "bucketize.Tensor", "bucketize.Scalar"}


def _items(x: np.ndarray, op: str) -> list[np.ndarray]:
    """Three items from one sample input: itself, its elements reversed, and shuffled (the
    same values, so index ranges and dtypes stay valid, but every item differs); sorted
    along the last dim again for the ops that search sorted sequences."""
    flat = x.reshape(-1)
    perm = np.random.default_rng(1).permutation(flat.size)
    items = [x, flat[::-1].reshape(x.shape), flat[perm].reshape(x.shape)]
    return [np.sort(i, -1) if op in SORTED_INPUTS and i.ndim else i for i in items]


def _numpy(results) -> list[np.ndarray]:
    return [np.asarray(r.numpy()) for r in leaves(results)]


def _looped(call, per_item: list[list]) -> list[np.ndarray]:
    """What vmap must give: call on each item, the results stacked."""
    outs = [_numpy(call(*[tc.tensor(a) for a in item])) for item in per_item]
    return [np.stack([o[j] for o in outs]) for j in range(len(outs[0]))]


def _assert_same(got: list, want: list, rtol=1e-4, atol=1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def _mappings(n: int) -> list[tuple[str, list[int], int]]:
    """(name, which inputs are mapped, the axis they are mapped over)."""
    out = [("all", list(range(n)), 0), ("first", [0], 0), ("all at the last axis", list(range(n)), -1)]
    return out + ([("last", [n - 1], 0)] if n > 1 else [])


def _mapped_call(s, mapped: list[int], axis: int, wrap=lambda f: f):
    """(vmapped results, looped results) of sample `s` with `mapped` inputs batched."""
    items = [_items(np.asarray(x), s.op) for x in s.inputs]
    per_item = [[items[i][k] if i in mapped else items[i][0] for i in range(len(items))] for k in range(3)]
    want = _looped(s.call, per_item)
    args = [tc.tensor(np.stack(items[i], axis=axis)) if i in mapped else tc.tensor(items[i][0])
            for i in range(len(items))]
    axes = tuple(axis if i in mapped else None for i in range(len(items)))
    return _numpy(wrap(tc.vmap(s.call, in_axes=axes))(*args)), want


@pytest.mark.parametrize("s", SAMPLES, ids=[s.id for s in SAMPLES])
def test_every_op_maps_like_a_loop(s):
    for name, mapped, axis in _mappings(len(s.inputs)):
        got, want = _mapped_call(s, mapped, axis)
        _assert_same(got, want)


# One sample per op of a primitive kind and every 8th composite, compiled: the batched ops
# go through the same scheduler and code generator as any other.
def _compiled_subset():
    from tracecomp.ops.table import default_table
    table, seen, out, composite = default_table(), set(), [], 0
    for s in SAMPLES:
        if s.op in seen:
            continue
        seen.add(s.op)
        if table[s.op].kind == "composite":
            composite += 1
            if composite % 8:
                continue
        out.append(s)
    return out


COMPILED = _compiled_subset()


@pytest.mark.parametrize("s", COMPILED, ids=[s.id for s in COMPILED])
def test_compiled_vmap_matches_the_loop(s):
    got, want = _mapped_call(s, list(range(len(s.inputs))), 0, wrap=tc.trace)
    _assert_same(got, want)


# ---------------------------------------------------------------- axes and nesting

X = np.random.default_rng(0).standard_normal((3, 4, 5))


def test_in_axes_and_out_axes_move_the_batch_dim():
    x = tc.tensor(X)
    got = tc.vmap(lambda r: r.sum(0), in_axes=1, out_axes=1)(x)     # items are X[:, j, :]
    np.testing.assert_allclose(got.numpy(), np.stack([X[:, j, :].sum(0) for j in range(4)], axis=1))
    got = tc.vmap(lambda r: r * 2, in_axes=-1, out_axes=-1)(x)
    np.testing.assert_allclose(got.numpy(), X * 2)


def test_in_axes_as_a_pytree_prefix_and_kwargs_are_not_mapped():
    params = {"w": tc.tensor(X[0]), "b": tc.tensor(np.ones(5))}
    xs = tc.tensor(X[1:, 0, :4])                                    # (2, 4)

    def f(p, x, *, scale):
        return (x @ p["w"] + p["b"]) * scale
    got = tc.vmap(f, in_axes=({"w": None, "b": None}, 0))(params, xs, scale=tc.tensor(2.0))
    want = np.stack([(r @ X[0] + 1) * 2 for r in X[1:, 0, :4]])
    np.testing.assert_allclose(got.numpy(), want)
    got = tc.vmap(f, in_axes=(None, 0))(params, xs, scale=3.0)
    np.testing.assert_allclose(got.numpy(), (want / 2) * 3)


def test_outputs_that_do_not_vary_are_broadcast_and_pytrees_come_back():
    x = tc.tensor(X)
    out = tc.vmap(lambda r: {"r": r.sum(), "c": tc.ones(2)}, out_axes={"r": 0, "c": 1})(x)
    np.testing.assert_allclose(out["r"].numpy(), X.reshape(3, -1).sum(1))
    assert out["c"].shape == (2, 3)
    same = tc.vmap(lambda r: (r.sum(), tc.ones(2)), out_axes=(0, None))(x)
    assert same[1].shape == (2,)


def test_none_passes_through_and_a_huge_batch_is_an_out_of_memory_error():
    out = tc.vmap(lambda r, nothing: (r * 2, None))(np.ones((2, 3)), None)
    assert out[1] is None and out[0].shape == (2, 3)
    with pytest.raises(tc.OutOfMemoryError, match=r"expand: cannot allocate .* GiB .*\[2, 1000000, 1000000\]"):
        tc.vmap(lambda a: a.expand(10**6, 10**6))(np.ones((2, 1)))


def test_nested_vmaps_map_two_axes():
    x, y = tc.tensor(X), tc.tensor(X[0])                              # (3, 4, 5), (4, 5)
    # outer over x's items (4, 5) with y whole, inner over rows of both
    got = tc.vmap(tc.vmap(lambda a, b: (a * b).sum()), in_axes=(0, None))(x, y)
    np.testing.assert_allclose(got.numpy(), (X * X[0]).sum(-1))
    # inner maps axis 1 of the outer item (columns), out_axes puts it first
    got = tc.vmap(tc.vmap(lambda c: c.max(), in_axes=1, out_axes=0), in_axes=0, out_axes=1)(x)
    np.testing.assert_allclose(got.numpy(), X.max(1).T)
    got = tc.vmap(tc.vmap(tc.vmap(lambda v: v * v)))(x)
    np.testing.assert_allclose(got.numpy(), X * X)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 4), rows=st.integers(1, 4), cols=st.integers(1, 4),
       axis=st.integers(0, 2), out_axis=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_random_shapes_and_axes(batch, rows, cols, axis, out_axis, seed):
    rng = np.random.default_rng(seed)
    item = rng.standard_normal((rows, cols))
    batched = np.stack([item + k for k in range(batch)], axis=axis)
    w = rng.standard_normal((cols, 2))

    def f(a, w):
        return tc.softmax(a @ w, -1).sum(0) * a.mean() + tc.tanh(a).amax(1).sum()
    got = tc.vmap(f, in_axes=(axis, None), out_axes=out_axis)(tc.tensor(batched), tc.tensor(w))
    want = np.stack([f(tc.tensor(np.take(batched, k, axis)), tc.tensor(w)).numpy() for k in range(batch)],
                    axis=out_axis)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- with autodiff and trace

torch = pytest.importorskip("torch")
rng = np.random.default_rng(7)
P = {"w1": rng.standard_normal((5, 8)), "b1": rng.standard_normal(8), "w2": rng.standard_normal((8, 3))}
DATA, LABELS = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)


def mlp_loss(lib, functional):
    def loss(p, x, y):
        h = lib.tanh(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"]
        return functional.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))
    return loss


def _torch_tree(tree):
    return {k: torch.tensor(v) for k, v in tree.items()}


def _np_tree(tree):
    return {k: (v.detach().numpy() if hasattr(v, "detach") else v.numpy()) for k, v in tree.items()}


def test_per_example_gradients_of_an_mlp():
    loss = mlp_loss(tc, tc.nn.functional)
    per_example = tc.vmap(tc.grad(loss), in_axes=(None, 0, 0))
    got = _np_tree(per_example(P, DATA, LABELS))
    looped = [_np_tree(tc.grad(loss)(P, tc.tensor(DATA[i]), tc.tensor(LABELS[i]))) for i in range(len(DATA))]
    tloss = mlp_loss(torch, torch.nn.functional)
    want = _np_tree(torch.func.vmap(torch.func.grad(tloss), in_dims=(None, 0, 0))(
        _torch_tree(P), torch.tensor(DATA), torch.tensor(LABELS)))
    for k in P:
        assert got[k].shape == (len(DATA),) + P[k].shape
        np.testing.assert_allclose(got[k], np.stack([g[k] for g in looped]), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)
    compiled = tc.trace(per_example)
    for k, v in _np_tree(compiled(P, DATA, LABELS)).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-10, atol=1e-12)


def test_per_example_gradients_compile_once_into_one_kernel_set():
    """One signature, and a graph whose size does not grow with the batch: the items are
    never unrolled."""
    loss = mlp_loss(tc, tc.nn.functional)
    compiled = tc.trace(tc.vmap(tc.grad(loss), in_axes=(None, 0, 0)))
    sizes = []
    for n in (2, 6):
        lowered = compiled.lower(P, DATA[:n], LABELS[:n])
        sizes.append(len(lowered.graph.ops))
    assert sizes[0] == sizes[1]
    for _ in range(3):
        compiled(P, DATA, LABELS)
    assert len(compiled._cache) == 2          # the two sizes lowered above, nothing more


def test_grad_of_vmap_and_vmap_of_grad_of_grad_match_torch_func():
    def f(lib):
        return lambda w, x: (lib.sin(x * w) * w).sum()
    w, xs = rng.standard_normal(4), rng.standard_normal((3, 4))
    tw, txs = torch.tensor(w), torch.tensor(xs)
    # the gradient of a mapped sum
    got = tc.grad(lambda w: tc.vmap(f(tc), in_axes=(None, 0))(w, xs).sum())(w)
    want = torch.func.grad(lambda w: torch.func.vmap(f(torch), in_dims=(None, 0))(w, txs).sum())(tw)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    # per-example Hessian diagonals by vmap of grad of grad
    got = tc.vmap(tc.grad(lambda w, x: tc.grad(f(tc))(w, x).sum()), in_axes=(None, 0))(w, xs)
    want = torch.func.vmap(torch.func.grad(lambda w, x: torch.func.grad(f(torch))(w, x).sum()),
                           in_dims=(None, 0))(tw, txs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    # the gradient, w.r.t. w, of a per-example gradient penalty
    pen = tc.grad(lambda w: (tc.vmap(tc.grad(f(tc)), in_axes=(None, 0))(w, xs) ** 2).sum())(w)
    tpen = torch.func.grad(lambda w: (torch.func.vmap(torch.func.grad(f(torch)), in_dims=(None, 0))(w, txs) ** 2)
                           .sum())(tw)
    np.testing.assert_allclose(pen.numpy(), tpen.numpy(), rtol=1e-12)


def test_jvp_and_vjp_inside_and_outside_vmap():
    def f(lib):
        return lambda x: lib.exp(x) * x.sum()
    x, basis = rng.standard_normal(3), np.eye(3)
    # the Jacobian, one row or column per item: vmap of vjp and of jvp
    out, pull = tc.vjp(f(tc), x)
    rows = tc.vmap(lambda ct: pull(ct)[0])(basis)
    cols = tc.vmap(lambda t: tc.jvp(f(tc), (x,), (t,))[1], out_axes=1)(basis)
    want = torch.func.jacrev(f(torch))(torch.tensor(x)).numpy()
    np.testing.assert_allclose(rows.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(cols.numpy(), want, rtol=1e-12)
    # jvp of a mapped function
    xs, ts = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    _, tangent = tc.jvp(tc.vmap(f(tc)), (xs,), (ts,))
    want = torch.func.jvp(torch.func.vmap(f(torch)), (torch.tensor(xs),), (torch.tensor(ts),))[1]
    np.testing.assert_allclose(tangent.numpy(), want.numpy(), rtol=1e-12)


def test_vmap_of_a_traced_function_compiles_the_mapped_function():
    calls = []

    def f(a, w):
        calls.append(1)
        return tc.relu(a @ w).sum(-1)
    compiled = tc.trace(f)
    a, w = rng.standard_normal((4, 3, 5)), rng.standard_normal((5, 2))
    want = np.stack([np.maximum(a[i] @ w, 0).sum(-1) for i in range(4)])
    got = tc.vmap(compiled, in_axes=(0, None))(a, w)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    tc.vmap(compiled, in_axes=(0, None))(a, w)
    assert len(calls) == 1                      # traced once, on the whole batch
    got = tc.vmap(tc.vmap(compiled, in_axes=(0, None)), in_axes=(0, None))(a[None].repeat(2, 0), w)
    np.testing.assert_allclose(got.numpy(), np.stack([want, want]), rtol=1e-12)
    # inside another trace it is inlined into that graph
    np.testing.assert_allclose(tc.trace(lambda a, w: compiled(a, w) * 2)(a[0], w).numpy(), want[0] * 2,
                               rtol=1e-12)


def test_grad_of_a_traced_function_differentiates_it():
    """It ran without autograd and gave zeros before: a silent wrong answer."""
    compiled = tc.trace(lambda a: (a * a).sum())
    np.testing.assert_allclose(tc.grad(compiled)(tc.tensor([1.0, 2.0])).numpy(), [2.0, 4.0])
    compiled(tc.tensor([1.0, 2.0]))             # now the fast path knows this signature
    np.testing.assert_allclose(tc.grad(compiled)(tc.tensor([1.0, 2.0])).numpy(), [2.0, 4.0])
    _, tangent = tc.jvp(compiled, (tc.tensor([1.0, 2.0]),), (tc.tensor([1.0, 0.0]),))
    assert tangent.item() == 2.0


# ---------------------------------------------------------------- randomness

def test_randomness():
    x = tc.ones(4, 3)
    with pytest.raises(tc.VmapError, match=r"rand.*randomness='error'.*'different'.*'same'"):
        tc.vmap(lambda r: r + tc.rand(3))(x)
    tc.manual_seed(0)
    different = tc.vmap(lambda r: r + tc.rand(3), randomness="different")(x).numpy()
    assert len({tuple(row) for row in different}) == 4
    same = tc.vmap(lambda r: tc.nn.functional.dropout(r, 0.5), randomness="same")(x).numpy()
    assert all((row == same[0]).all() for row in same)
    nested = tc.vmap(tc.vmap(lambda v: v + tc.randn(()), randomness="different"),
                     randomness="different")(x).numpy()
    assert len(set(nested.reshape(-1).tolist())) == 12


# ---------------------------------------------------------------- errors

def test_errors_name_what_cannot_be_mapped():
    x = tc.ones(3, 2)
    with pytest.raises(tc.VmapError, match=r"mapped axes have different sizes: args\[0\] has 3 .* "
                                           r"args\[1\] has 2"):
        tc.vmap(lambda a, b: a + b)(x, tc.ones(2, 2))
    with pytest.raises(tc.VmapError, match=r"args\[1\] has shape \(\), so it has no axis 0.*give it None"):
        tc.vmap(lambda a, b: a * b)(x, tc.tensor(2.0))
    with pytest.raises(tc.VmapError, match=r"args\[1\] is a float \(2.0\), not an array.*None in in_axes"):
        tc.vmap(lambda a, b: a * b)(x, 2.0)
    with pytest.raises(tc.VmapError, match=r"in_axes has 1 entries, but .* 2 positional"):
        tc.vmap(lambda a, b: a * b, in_axes=(0,))(x, x)
    with pytest.raises(tc.VmapError, match=r"no input is mapped"):
        tc.vmap(lambda a: a, in_axes=None)(x)
    with pytest.raises(tc.VmapError, match=r"out_axes is None for output, but it varies"):
        tc.vmap(lambda a: a, out_axes=None)(x)
    with pytest.raises(tc.VmapError, match=r"nonzero.*inside tc.vmap a tensor stands for a whole batch"):
        tc.vmap(tc.nonzero)(x)
    with pytest.raises(tc.VmapError, match=r"Tensor.item\(\) needs the tensor's value.*tc.vmap"):
        tc.vmap(lambda a: a.sum().item())(x)
    with pytest.raises(tc.VmapError, match=r"in-place op would write a batched value into a tensor that "
                                           r"is not batched"):
        tc.vmap(lambda a: tc.zeros(2).add_(a))(x)
    escaped = []
    tc.vmap(lambda a: escaped.append(a) or a)(x)
    with pytest.raises(tc.VmapError, match="escape"):
        escaped[0] + 1
    with pytest.raises(tc.ShapeError, match=r"matmul.*'self' \(2,\) @ 'other' \(3,\)"):     # the item's shapes
        tc.vmap(lambda a: a @ tc.ones(3))(x)
    with pytest.raises(tc.VmapError, match=r"randomness must be one of"):
        tc.vmap(lambda a: a, randomness="sometimes")


def test_in_place_changes_and_assignment_inside_vmap():
    def f(r):
        r = r.clone()
        r.mul_(2)
        r[0] = r[1] + 1
        r[-1:] += 10
        return r
    x = np.arange(12.0).reshape(3, 4)
    want = np.stack([f(tc.tensor(row)).numpy() for row in x])
    np.testing.assert_allclose(tc.vmap(f)(x).numpy(), want)
    np.testing.assert_allclose(tc.trace(tc.vmap(f))(x).numpy(), want)


def test_an_op_without_a_batching_rule_is_named(monkeypatch):
    from tracecomp.dispatch import batching
    monkeypatch.delitem(batching.BATCH_RULES, "flip")
    with pytest.raises(tc.VmapError, match=r"flip: tc.vmap has no batching rule for ops of kind 'flip' "
                                           r"\(ops.yaml:\d+\)"):
        tc.vmap(lambda r: tc.flip(r, [0]))(tc.ones(2, 3))


@pytest.mark.parametrize("order", ["vmap(trace(grad))", "trace(vmap(grad))", "vmap(grad(trace))",
                                   "grad(vmap(trace))"])
def test_vmap_grad_and_trace_compose_in_any_order(order):
    def f(lib):
        return lambda w, x: lib.sin(x @ w).sum()
    w, xs = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    tw, txs = torch.tensor(w), torch.tensor(xs)
    if order == "grad(vmap(trace))":
        got = tc.grad(lambda w: tc.vmap(tc.trace(f(tc)), in_axes=(None, 0))(w, xs).sum())(w)
        want = torch.func.grad(lambda w: torch.func.vmap(f(torch), in_dims=(None, 0))(w, txs).sum())(tw)
    else:
        inner = {"vmap(trace(grad))": lambda: tc.vmap(tc.trace(tc.grad(f(tc))), in_axes=(None, 0)),
                 "trace(vmap(grad))": lambda: tc.trace(tc.vmap(tc.grad(f(tc)), in_axes=(None, 0))),
                 "vmap(grad(trace))": lambda: tc.vmap(tc.grad(tc.trace(f(tc))), in_axes=(None, 0))}[order]()
        got = inner(w, xs)
        want = torch.func.vmap(torch.func.grad(f(torch)), in_dims=(None, 0))(tw, txs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
