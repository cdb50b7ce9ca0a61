"""tc.scan, tc.fori_loop, tc.while_loop and tc.cond: eager, traced (one region op), in
gradients (against the unrolled eager program and finite differences), jvp and vmap.

Every test runs twice: traced programs on the compiled CPU backend (native loops) and on
the reference interpreter (BACKEND, set per run by the `backend` fixture).
"""
import numpy as np
import pytest

import tracecomp as tc

BACKEND = "cpu"


@pytest.fixture(autouse=True, params=["cpu", "interp"])
def backend(request):
    global BACKEND
    BACKEND = request.param
    yield request.param
    BACKEND = "cpu"
rng = np.random.default_rng(0)
W = tc.tensor(rng.standard_normal((3, 3)) * 0.5)
XS = tc.tensor(rng.standard_normal((6, 3)))
INIT = tc.tensor(rng.standard_normal(3))


def cell(c, x):
    c = tc.tanh(c @ W + x)
    return c, tc.sin(c) * 2.0


def unrolled(init, xs, reverse=False):
    """The same loop as a Python loop: what tc.scan must equal."""
    c, ys = init, [None] * xs.shape[0]
    steps = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for i in steps:
        c, ys[i] = cell(c, xs[i])
    return c, tc.stack(ys, 0)


def close(a, b, tol=1e-10):
    a, b = np.asarray(a.numpy() if isinstance(a, tc.Tensor) else a), np.asarray(b.numpy() if isinstance(b, tc.Tensor) else b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def ops_of(fn, *args):
    """The op names of fn's optimized graph (outermost level)."""
    return [op.name for op in tc.trace(fn, backend=BACKEND).lower(*args).graph.ops]


# ---------------------------------------------------------------- values

@pytest.mark.parametrize("reverse", [False, True])
def test_scan_equals_the_python_loop_eager_and_traced(reverse):
    want = unrolled(INIT, XS, reverse)
    eager = tc.scan(cell, INIT, XS, reverse=reverse)
    traced = tc.trace(lambda i, x: tc.scan(cell, i, x, reverse=reverse), backend=BACKEND)(INIT, XS)
    for w, e, t in zip(want, eager, traced):
        close(e, w)
        close(t, w)


def test_traced_scan_is_one_op_whatever_the_length():
    short = ops_of(lambda i, x: tc.scan(cell, i, x), INIT, XS[:2])
    long = ops_of(lambda i, x: tc.scan(cell, i, x), INIT, tc.tensor(rng.standard_normal((500, 3))))
    assert short == long == ["tc.scan"]


def test_scan_over_pytrees_with_length_and_no_xs():
    def step(carry, _):
        return {"n": carry["n"] + 1, "acc": (carry["acc"][0] * 2.0,)}, carry["n"] * 3
    init = {"n": tc.tensor(np.int64(0)), "acc": (tc.tensor(np.ones(2)),)}
    for fn in (lambda c: tc.scan(step, c, None, length=5), tc.trace(lambda c: tc.scan(step, c, None, length=5), backend=BACKEND)):
        carry, ys = fn(init)
        assert int(carry["n"]) == 5
        close(carry["acc"][0], np.full(2, 32.0))
        np.testing.assert_array_equal(ys.numpy(), [0, 3, 6, 9, 12])


def test_scan_of_length_zero_returns_init_and_empty_ys():
    xs = tc.tensor(np.zeros((0, 3)))
    for fn in (lambda i, x: tc.scan(cell, i, x), tc.trace(lambda i, x: tc.scan(cell, i, x), backend=BACKEND)):
        c, ys = fn(INIT, xs)
        close(c, INIT)
        assert ys.shape == (0, 3)


def test_nested_scan_and_cond_inside_while():
    def outer(c, x):
        inner, _ = tc.scan(lambda a, b: (a * 0.5 + b, a), c, tc.stack([x, x * 2.0], 0))
        return inner, inner.sum()

    def program(i, xs):
        c, ys = tc.scan(outer, i, xs)
        n, v = tc.while_loop(lambda s: s[0] < 4,
                             lambda s: (s[0] + 1, tc.cond(s[1].sum() > 0, lambda v: v - 1.0, lambda v: v + 1.0, s[1])),
                             (tc.tensor(np.int64(0)), c))
        return c, ys, n, v
    want = program(INIT, XS)
    got = tc.trace(program, backend=BACKEND)(INIT, XS)
    for w, g in zip(want, got):
        close(g, w)
    assert ops_of(program, INIT, XS).count("tc.scan") == 1


def test_fori_loop_static_and_run_time_bounds():
    def body(i, v):
        return v * 1.5 + i.to(tc.float64)
    want = np.ones(2)
    for i in range(2, 7):
        want = want * 1.5 + i
    v = tc.tensor(np.ones(2))
    close(tc.fori_loop(2, 7, body, v), want)
    close(tc.trace(lambda v: tc.fori_loop(2, 7, body, v), backend=BACKEND)(v), want)
    run_time = tc.trace(lambda lo, hi, v: tc.fori_loop(lo, hi, body, v), backend=BACKEND)
    close(run_time(tc.tensor(np.int64(2)), tc.tensor(np.int64(7)), v), want)
    close(run_time(tc.tensor(np.int64(2)), tc.tensor(np.int64(2)), v), np.ones(2))    # no step
    assert "tc.while_loop" in ops_of(lambda lo, hi, v: tc.fori_loop(lo, hi, body, v),
                                     tc.tensor(np.int64(0)), tc.tensor(np.int64(3)), v)


def newton_sqrt(a):
    """Newton's iteration for sqrt(a) until converged: a data-dependent trip count."""
    def cond_fn(s):
        return tc.abs(s[0] * s[0] - a).max() > 1e-12

    def body_fn(s):
        x, n = s
        return 0.5 * (x + a / x), n + 1
    return tc.while_loop(cond_fn, body_fn, (a, tc.tensor(np.int64(0))))


def test_while_loop_runs_until_its_predicate_fails():
    a = tc.tensor(np.array([2.0, 9.0, 1e4]))
    x, n = newton_sqrt(a)
    tx, tn = tc.trace(newton_sqrt, backend=BACKEND)(a)
    close(x, np.sqrt(a.numpy()))
    close(tx, x)
    assert int(tn) == int(n) > 3


@pytest.mark.parametrize("flag", [True, False])
def test_cond_takes_the_branch_its_predicate_chooses(flag):
    def program(p, x):
        return tc.cond(p, lambda v: (v * W.sum(), v + 1.0), lambda v: (v - 1.0, v * v), x)
    p = tc.tensor(np.bool_(flag))
    want = program(p, INIT)
    got = tc.trace(program, backend=BACKEND)(p, INIT)
    for w, g in zip(want, got):
        close(g, w)
    assert ops_of(program, p, INIT) == ["tc.cond"]


def test_cond_with_a_python_bool_just_calls_the_branch():
    assert tc.cond(True, lambda: 1, lambda: 2) == 1


# ---------------------------------------------------------------- gradients

def loss(init, xs, w):
    def f(c, x):
        c = tc.tanh(c @ w + x)
        return c, tc.sin(c)
    c, ys = tc.scan(f, init, xs)
    return (c * c).sum() + (ys * tc.arange(ys.shape[0], dtype=tc.float64).reshape(-1, 1)).sum()


def loss_unrolled(init, xs, w):
    c, ys = init, []
    for i in range(xs.shape[0]):
        c = tc.tanh(c @ w + xs[i])
        ys.append(tc.sin(c))
    ys = tc.stack(ys, 0)
    return (c * c).sum() + (ys * tc.arange(ys.shape[0], dtype=tc.float64).reshape(-1, 1)).sum()


def test_scan_gradients_equal_the_unrolled_program_and_finite_differences():
    want = tc.grad(loss_unrolled, argnums=(0, 1, 2))(INIT, XS, W)
    eager = tc.grad(loss, argnums=(0, 1, 2))(INIT, XS, W)
    traced = tc.trace(tc.grad(loss, argnums=(0, 1, 2)), backend=BACKEND)(INIT, XS, W)
    for w, e, t in zip(want, eager, traced):
        close(e, w)
        close(t, w)
    assert tc.gradcheck(lambda i, x, w: tc.trace(loss, backend=BACKEND)(i, x, w), (INIT, XS, W))


def test_grad_of_a_closed_over_weight_through_a_traced_scan():
    w = tc.tensor(W.numpy(), requires_grad=True)

    def step(i, xs):
        return loss(i, xs, w)
    traced = tc.trace(lambda i, xs: tc.grad(lambda v: loss(i, xs, v))(w), backend=BACKEND)(INIT, XS)
    close(traced, tc.grad(loss_unrolled, argnums=2)(INIT, XS, W))


def test_second_order_gradient_through_scan():
    def f(w):
        return loss(INIT, XS[:3], w)

    def g(w):
        return loss_unrolled(INIT, XS[:3], w)
    hv = tc.grad(lambda w: (tc.grad(f)(w) * W).sum())
    want = tc.grad(lambda w: (tc.grad(g)(w) * W).sum())(W)
    close(tc.trace(hv, backend=BACKEND)(W), want, 1e-9)


def test_scan_jvp_equals_the_unrolled_jvp():
    t = tc.ones_like(W)
    want = tc.jvp(lambda w: loss_unrolled(INIT, XS, w), (W,), (t,))
    got = tc.trace(lambda w, t: tc.jvp(lambda w: loss(INIT, XS, w), (w,), (t,)), backend=BACKEND)(W, t)
    close(got[0], want[0])
    close(got[1], want[1])


def test_cond_gradients_and_jvp_follow_the_branch():
    def f(p, x):
        return tc.cond(p, lambda v: (tc.sin(v) * W[0]).sum(), lambda v: (v * v * v).sum(), x)
    for flag in (True, False):
        p = tc.tensor(np.bool_(flag))
        want = tc.grad(lambda x: (tc.sin(x) * W[0]).sum() if flag else (x * x * x).sum())(INIT)
        close(tc.trace(lambda p, x: tc.grad(lambda x: f(p, x))(x), backend=BACKEND)(p, INIT), want)
        close(tc.trace(lambda p, x, t: tc.jvp(lambda x: f(p, x), (x,), (t,))[1], backend=BACKEND)(
            p, INIT, tc.ones_like(INIT)), (want * tc.ones_like(INIT)).sum())


def test_while_loop_jvp_and_the_reverse_mode_error():
    a = tc.tensor(np.array([2.0, 9.0]))
    t = tc.tensor(np.array([1.0, 1.0]))
    _, tangent = tc.trace(lambda a, t: tc.jvp(lambda a: newton_sqrt(a)[0], (a,), (t,)), backend=BACKEND)(a, t)
    close(tangent, 0.5 / np.sqrt(a.numpy()), 1e-8)
    with pytest.raises(tc.TracecompError, match="fori_loop"):
        tc.trace(tc.grad(lambda a: newton_sqrt(a)[0].sum()), backend=BACKEND)(a)


def test_fori_loop_with_int_bounds_has_a_gradient():
    def f(v):
        return tc.fori_loop(0, 4, lambda i, v: tc.sin(v) * 1.1, v).sum()

    def g(v):
        for _ in range(4):
            v = tc.sin(v) * 1.1
        return v.sum()
    close(tc.trace(tc.grad(f), backend=BACKEND)(INIT), tc.grad(g)(INIT))


# ---------------------------------------------------------------- vmap

def test_vmap_of_scan_is_one_scan_over_the_batch():
    inits = tc.tensor(rng.standard_normal((4, 3)))
    xss = tc.tensor(rng.standard_normal((4, 6, 3)))
    want = tc.stack([unrolled(inits[b], xss[b])[1] for b in range(4)], 0)
    fn = lambda i, x: tc.vmap(lambda i, x: tc.scan(cell, i, x)[1])(i, x)   # noqa: E731
    close(tc.trace(fn, backend=BACKEND)(inits, xss), want)
    close(tc.trace(lambda i: tc.vmap(lambda i: tc.scan(cell, i, XS)[0])(i), backend=BACKEND)(inits),
          tc.stack([unrolled(inits[b], XS)[0] for b in range(4)], 0))
    assert ops_of(fn, inits, xss).count("tc.scan") == 1


def test_vmap_of_while_loop_runs_each_item_to_its_own_end():
    a = tc.tensor(np.array([[2.0], [9.0], [1e6]]))
    x, n = tc.trace(lambda a: tc.vmap(newton_sqrt)(a), backend=BACKEND)(a)
    close(x, np.sqrt(a.numpy()))
    assert [int(k) for k in n.numpy()] == [int(newton_sqrt(a[b])[1]) for b in range(3)]


def test_vmap_of_cond_with_a_batched_predicate_selects_per_item():
    xs = tc.tensor(np.array([-1.0, 2.0, -3.0]))
    fn = lambda x: tc.cond(x > 0, lambda v: v * 10.0, lambda v: -v, x)   # noqa: E731
    close(tc.trace(tc.vmap(fn), backend=BACKEND)(xs), np.array([1.0, 20.0, 3.0]))
    close(tc.vmap(fn)(xs), np.array([1.0, 20.0, 3.0]))


# ---------------------------------------------------------------- errors

def test_a_carry_that_changes_type_names_the_leaf_both_types_and_the_line():
    def bad(c, x):
        return {"h": c["h"], "c": tc.stack([c["c"], c["c"]])}, x
    init = {"h": INIT, "c": INIT}
    for fn in (lambda: tc.scan(bad, init, XS), lambda: tc.trace(lambda: tc.scan(bad, init, XS), backend=BACKEND)()):
        with pytest.raises(tc.ControlFlowError) as e:
            fn()
        text = str(e.value)
        assert "carry['c']" in text and "tensor<3xf64>" in text and "tensor<2x3xf64>" in text
        assert "test_control_flow.py" in text


def test_mismatched_branches_and_bad_arguments_are_clear_errors():
    with pytest.raises(tc.ControlFlowError, match="both branches"):
        tc.trace(lambda p, x: tc.cond(p, lambda v: v, lambda v: v.sum(), x), backend=BACKEND)(
            tc.tensor(np.bool_(True)), INIT)
    with pytest.raises(tc.ControlFlowError, match="0-d bool"):
        tc.cond(INIT, lambda: 1, lambda: 2)
    with pytest.raises(tc.ControlFlowError, match="leading size"):
        tc.scan(cell, INIT, (XS, XS[:2]))
    with pytest.raises(tc.ControlFlowError, match="pair"):
        tc.scan(lambda c, x: c, INIT, XS)
    with pytest.raises(tc.ControlFlowError, match="0-d bool"):
        tc.while_loop(lambda s: s, lambda s: s, INIT)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("unroll", [2, 3, 4, 6])
def test_unroll_runs_that_many_steps_per_iteration(unroll, reverse):
    want = unrolled(INIT, XS, reverse)
    fn = lambda i, x: tc.scan(cell, i, x, reverse=reverse, unroll=unroll)   # noqa: E731
    for w, g in zip(want, tc.trace(fn, backend=BACKEND)(INIT, XS)):
        close(g, w)
    scans = [op for op in tc.trace(fn, backend=BACKEND).lower(INIT, XS).graph.ops if op.name == "tc.scan"]
    assert scans[0].attrs["length"] == len(XS) // unroll or scans[-1].attrs["length"] == len(XS) // unroll
    tanh_per_body = max(sum(o.name == "tc.tanh" for o in op.regions[0].ops) for op in scans)
    assert tanh_per_body == unroll
    got = tc.trace(tc.grad(lambda i: fn(i, XS)[1].sum()), backend=BACKEND)(INIT)
    close(got, tc.grad(lambda i: unrolled(i, XS, reverse)[1].sum())(INIT))


def test_a_body_that_writes_a_tensor_from_outside_raises_and_leaves_it_unchanged():
    outside = tc.tensor(np.zeros(3))

    def body(c, x):
        outside.add_(x)
        return c + x, c
    with pytest.raises(tc.TraceError, match="in place"):
        tc.trace(lambda i, x: tc.scan(body, i, x), backend=BACKEND)(INIT, XS)
    np.testing.assert_array_equal(outside.numpy(), np.zeros(3))
    assert outside._value is None
    tc.scan(body, INIT, XS[:2])                # eagerly it is a Python loop: the writes happen
    close(outside, XS[:2].numpy().sum(0))


def _scan_loss(w):
    c, ys = tc.scan(lambda c, x: (tc.tanh(c + x * w), tc.sin(c)), tc.zeros(3, dtype=tc.float64), XS[:3])
    return c.sum() + (ys * ys).sum()


def _cond_loss(w):
    return tc.cond(w.sum() > 0, lambda v: (tc.sin(v) * v).sum(), lambda v: (v ** 3).sum(), w)


@pytest.mark.parametrize("loss", [_scan_loss, _cond_loss], ids=["scan", "cond"])
@pytest.mark.parametrize("transform", [
    lambda f: (lambda w: tc.jvp(tc.grad(f), (w,), (tc.ones_like(w),))[1]),   # forward over reverse
    lambda f: tc.grad(lambda w: tc.jvp(f, (w,), (tc.ones_like(w),))[1]),     # reverse over forward
    lambda f: tc.hessian(f),
    lambda f: tc.jacrev(tc.jacrev(f)),
    lambda f: (lambda w: tc.vmap(tc.grad(f))(tc.stack([w, w * 2.0]))),
], ids=["jvp-grad", "grad-jvp", "hessian", "jacrev-jacrev", "vmap-grad"])
def test_composed_transforms_through_regions_match_the_eager_loops(loss, transform):
    w = tc.tensor(np.array([0.5, -0.3, 0.2]))
    close(tc.trace(transform(loss), backend=BACKEND)(w), transform(loss)(w), 1e-9)


def test_fori_loop_with_run_time_bounds_and_max_steps_has_a_gradient():
    def f(v, hi):
        return tc.fori_loop(tc.tensor(np.int64(0)), hi, lambda i, v: tc.sin(v) * 1.1, v, max_steps=6).sum()

    def g(v, n):
        for _ in range(n):
            v = tc.sin(v) * 1.1
        return v.sum()
    step = tc.trace(tc.value_and_grad(f), backend=BACKEND)
    for n in (0, 3, 6):
        value, grad = step(INIT, tc.tensor(np.int64(n)))
        close(value, g(INIT, n))
        close(grad, tc.grad(g)(INIT, n))


def test_remat_recomputes_the_step_in_the_backward_with_the_same_gradients():
    def loss_of(remat):
        def f(init, xs, w):
            c, ys = tc.scan(lambda c, x: (tc.tanh(c @ w + x), tc.sin(c)), init, xs, remat=remat)
            return (c * c).sum() + (ys * ys).sum()
        return f
    want = tc.grad(loss_unrolled_plain, argnums=(0, 1, 2))(INIT, XS, W)
    step = tc.trace(tc.grad(loss_of(True), argnums=(0, 1, 2)), backend=BACKEND)
    for g, w in zip(step(INIT, XS, W), want):
        close(g, w)
    text = step.lower(INIT, XS, W).as_text("optimized")
    assert "remat = true" in text
    # the forward stacks only the carry: one stacked (6, 3) value besides the ys
    plain = tc.trace(tc.grad(loss_of(False), argnums=(0, 1, 2)), backend=BACKEND).lower(INIT, XS, W)
    stacked = lambda g: [r.type.shape for op in g.ops if op.name == "tc.scan" for r in op.results]   # noqa: E731
    assert len(stacked(step.lower(INIT, XS, W).graph)) < len(stacked(plain.graph))
    close(tc.trace(tc.grad(lambda w: tc.grad(loss_of(True), argnums=2)(INIT, XS[:3], w).sum()), backend=BACKEND)(W),
          tc.grad(lambda w: tc.grad(loss_unrolled_plain, argnums=2)(INIT, XS[:3], w).sum())(W), 1e-9)


def loss_unrolled_plain(init, xs, w):
    c, ys = init, []
    for i in range(xs.shape[0]):
        c, y = tc.tanh(c @ w + xs[i]), tc.sin(c)
        ys.append(y)
    ys = tc.stack(ys, 0)
    return (c * c).sum() + (ys * ys).sum()


def test_a_region_op_bound_on_eager_tensors_runs_its_loop():
    """The CPU rule: a traced region op re-evaluated eagerly (eval_graph outside any trace)."""
    from tracecomp.control.primitives import eval_graph
    graph = tc.trace(lambda i, x: tc.scan(cell, i, x), backend="interp").lower(INIT, XS).graph
    for w, g in zip(unrolled(INIT, XS), eval_graph(graph, [INIT, XS, W])):
        close(g, w)
