"""The scheduler (graph -> loop-IR kernels) against eager execution, through the loop-IR
interpreter, for the shared op samples; and the fusion decisions it makes."""
import re

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.interp import run_program
from tracecomp.lower.schedule.scheduler import schedule
from tracecomp.lower.loops.walk import count_exprs, walk

from tables.op_samples import SAMPLES

SMALL = [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss[:3]
         if all(np.asarray(a).size <= 400 for a in s.inputs)]


def _eager(s):
    out = tc.trace(s.call)(*s.inputs)
    return [np.asarray(t) for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("s", SMALL, ids=[s.id for s in SMALL])
def test_scheduled_program_matches_eager(s):
    try:
        graph = tc.trace(s.call).lower(*s.inputs).optimized
    except tc.TracecompError:
        pytest.skip("the sample is an error case")
    got = run_program(schedule(graph), [np.asarray(a) for a in s.inputs])
    for e, o in zip(_eager(s), got):
        assert (e.dtype, e.shape) == (o.dtype, o.shape)
        np.testing.assert_allclose(o.astype(float), e.astype(float), rtol=1e-5, atol=1e-6, equal_nan=True)


def _kernels(fn, *inputs):
    return schedule(tc.trace(fn).lower(*inputs).optimized).kernels


def test_elementwise_chain_with_broadcast_is_one_kernel():
    x, b = np.ones((4, 8), np.float32), np.ones(8, np.float32)
    ks = _kernels(lambda x, b: ((x + b) * 2).tanh().sigmoid() - x.T.T, x, b)
    assert len(ks) == 1


def test_reduction_fuses_its_producers_and_views():
    x = np.ones((4, 8), np.float32)
    ks = _kernels(lambda x: (x.T * 3).exp().sum(0), x)
    assert len(ks) == 1 and ks[0].name.endswith("sum")


def test_multi_use_values_are_computed_once():
    x = np.ones((4, 8), np.float32)
    ks = _kernels(lambda x: (x.exp() + 1, x.exp().tanh()), x)
    assert len(ks) == 3 and ks[0].name.endswith("exp")


# ---------------------------------------------------------------- row fusion

def _program(fn, *inputs):
    return tc.trace(fn).lower(*inputs).program


def _statements(body, kind):
    """Every statement of a type in a body, through nested bodies."""
    found = []
    for s in body:
        if isinstance(s, kind):
            found.append(s)
        found += _statements(getattr(s, "body", []), kind)
    return found


def _check_against_interp(fn, *inputs, rtol=1e-5, atol=1e-6):
    got, want = tc.trace(fn)(*inputs), tc.trace(fn, backend="interp")(*inputs)
    for g, w in zip(*(o if isinstance(o, (tuple, list)) else [o] for o in (got, want))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def test_row_softmax_is_one_kernel_with_its_reductions_in_registers():
    x = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    p = _program(lambda x: tc.softmax(x, dim=1), x)
    [k] = p.kernels
    [outer] = k.body
    # max; exp(x - max) into the output row; its sum (from the row, in cache); the division
    assert outer.parallel and outer.extent == 64
    assert [type(s).__name__ for s in outer.body] == ["Reduce", "Let", "Loop", "Reduce", "Let", "Loop"]
    assert all(s.extent == 1024 for s in outer.body if not isinstance(s, L.Let))
    assert sum(isinstance(e, L.Unary) and e.fn == "exp" for e in walk(k.body)) == 1
    assert [b.role for b in p.buffers.values()] == ["input", "output"]      # no temps
    assert [op.name for op in p.kernel_ops[k.name]] == ["tc.amax", "tc.sub", "tc.exp", "tc.sum", "tc.div"]
    _check_against_interp(lambda x: tc.softmax(x, dim=1), x)


def test_layernorm_with_weight_and_bias_is_one_kernel_two_passes_for_the_variance():
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 5, 300), (300,), (300,)))
    fn = lambda x, w, b: tc.layer_norm(x, [300], w, b)      # noqa: E731
    p = _program(fn, x, w, b)
    [k] = p.kernels
    [outer] = k.body
    [middle] = outer.body                          # outer dims (3, 5): the rows are the last dim
    assert [type(s).__name__ for s in middle.body] == ["Reduce", "Let", "Reduce", "Let", "Loop"]
    assert not [b for b in p.buffers.values() if b.role == "temp"]
    _check_against_interp(fn, x, w, b)
    x = x + 1000        # a large mean: E[x^2] - E[x]^2 in float32 would be off by O(1); two passes are not
    xd = x.astype(np.float64)
    mu, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    exact = (xd - mu) / np.sqrt(var + 1e-5) * w + b
    assert np.abs(np.asarray(tc.trace(fn)(x, w, b)) - exact).max() < 3e-3


def test_a_reduced_value_also_returned_is_stored_by_the_row_kernel():
    x = np.random.default_rng(2).standard_normal((6, 7)).astype(np.float32)
    fn = lambda x: (x - x.amax(1, keepdim=True), x.amax(1, keepdim=True), x.sum(-1))    # noqa: E731
    ks = _kernels(fn, x)
    assert len(ks) == 2          # the sum nobody else reads gets a kernel of its own
    assert len(_statements(ks[0].body, L.Store)) == 2
    _check_against_interp(fn, x)


def test_reductions_over_other_dims_or_read_across_rows_keep_their_own_kernels():
    x = np.random.default_rng(3).standard_normal((5, 5)).astype(np.float32)
    for fn in (lambda x: x / x.sum(0, keepdim=True),            # over the outer dim
               lambda x: x - x.amax(1),                         # broadcast along rows: read at [i1]
               lambda x: x - x.mean(),                          # over everything
               lambda x: x.sum(1, keepdim=True).T - x):         # row sums read across rows
        ks = _kernels(fn, x)
        assert len(ks) == 2 and not _statements(ks[1].body, L.Reduce), fn
        _check_against_interp(fn, x)


def test_row_fusion_in_the_backward_of_softmax_log_softmax_and_layernorm():
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((2, 8, 33)).astype(np.float32), rng.standard_normal((2, 8, 33)).astype(np.float32)
    w = rng.standard_normal(33).astype(np.float32)
    for f in (lambda x: tc.softmax(x, -1), lambda x: tc.log_softmax(x, -1),
              lambda x: tc.layer_norm(x, [33], w, w)):
        step = tc.value_and_grad(lambda x, g: (f(x) * g).sum())
        p = _program(step, x, g)
        rows = [k for k in p.kernels if len(k.body) == 1 and isinstance(k.body[0], L.Loop)
                and any(isinstance(s, L.Reduce) for s in k.body[0].body[0].body)]
        assert rows, [k.name for k in p.kernels]
        _check_against_interp(step, x, g, rtol=1e-4, atol=1e-5)


def test_row_kernels_pass_the_checker_and_mlir_opt():
    import subprocess
    from tracecomp.ir.mlir_tool import find_mlir_opt
    from tracecomp.lower.loops.check import check_kernel
    from tracecomp.lower.loops.printer import print_kernels
    x = np.random.default_rng(5).standard_normal((16, 40)).astype(np.float32)
    p = _program(lambda x: (tc.softmax(x, 1), tc.log_softmax(x, 1), x.var(1, keepdim=True) * x,
                            x.argmax(1, keepdim=True) == 3), x)
    for k in p.kernels:
        check_kernel(k)
    mlir_opt = find_mlir_opt()
    if mlir_opt is None:
        pytest.skip("mlir-opt not found (not in /usr/lib/llvm-22/bin nor on PATH)")
    proc = subprocess.run([mlir_opt, "-", "-o", "-"], input=print_kernels(p.kernels), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_row_kernel_sums_long_rows_in_blocks():
    """A 2**22-term f32 row sum fused into its consumer keeps the blocked sum's accuracy."""
    x = np.random.default_rng(6).random((2, 1 << 22), np.float32)
    out = np.asarray(tc.trace(lambda x: x / x.sum(1, keepdim=True))(x))
    exact = x.astype(np.float64) / x.astype(np.float64).sum(1, keepdims=True)
    assert np.abs(out / exact - 1).max() < 3e-7


def test_out_of_range_index_inputs_are_marked_for_checking():
    p = schedule(tc.trace(lambda x, t: tc.cross_entropy(x, t)).lower(
        np.ones((4, 3), np.float32), np.zeros(4, np.int64)).optimized)
    [(name, [check])] = p.index_checks.items()
    assert (check.op, check.dim, check.size, check.allowed) == ("gather", 1, 3, -100)   # ignore_index
    p = schedule(tc.trace(lambda x, t: tc.gather(x, 1, t)).lower(
        np.ones((4, 3), np.float32), np.zeros((4, 1), np.int64)).optimized)
    [(name, [check])] = p.index_checks.items()
    assert (check.op, check.dim, check.size, check.allowed) == ("gather", 1, 3, None)


def test_a_row_reduction_read_by_a_matmul_is_computed_before_it():
    """A Matmul reads whole buffers (views, not Loads): a deferred reduction it reads gets its
    own kernel first, also through the copy kernel of an operand that is not a view."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    for fn in (lambda x, w: x.sum(1) @ w, lambda x, w: (x.T - x.amax(1)) @ w,
               lambda x, w: tc.softmax(x, 1).T @ w):
        _check_against_interp(fn, x, w, rtol=1e-4, atol=1e-4)      # float32 sums in other orders


def test_row_kernel_loops_use_the_chosen_vectors_and_call_nothing(loop_vector_register):
    """Each pass over a row (the max, the sum of exponentials, the normalized store; the
    mean, the squared deviations, the store) is a vector loop at the chosen width."""
    from test_asm import _loops
    reg = loop_vector_register
    x = np.ones((64, 1024), np.float32)
    w = np.ones(1024, np.float32)
    for fn, args in ((lambda x: tc.softmax(x, 1), (x,)), (lambda x, w: tc.layer_norm(x, [1024], w, w), (x, w))):
        asm = tc.trace(fn).lower(*args).as_text("asm")
        loops = _loops(asm)
        vector_loops = [body for body in loops if re.search(rf"v\w+\s.*%{reg}\d", body)]
        assert len(vector_loops) >= 3, asm
        for body in vector_loops:       # (the thread launcher's chunk loop calls the row loop)
            assert not re.search(r"^\s+call", body, re.M), f"a call inside a loop:\n{body}"


def test_a_row_reduction_absorbed_and_also_read_by_a_matmul_stays_stored():
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    def fn(x, w):
        s = x.sum(1, keepdim=True)
        return x / s, s.T @ w              # the division's kernel computes s; the product reads it
    _check_against_interp(fn, x, w, rtol=1e-4, atol=1e-4)      # float32 sums in other orders


def test_a_batch_of_one_row_kernel_is_parallel_over_its_rows():
    x = np.random.default_rng(9).standard_normal((1, 64, 1024)).astype(np.float32)
    [k] = _kernels(lambda x: tc.softmax(x, -1), x)
    batch, = k.body
    assert not batch.parallel and batch.extent == 1
    assert batch.body[0].parallel and batch.body[0].extent == 64
    _check_against_interp(lambda x: tc.softmax(x, -1), x)


def test_a_per_row_value_of_a_reduction_absorbs_it_through_size_one_dims():
    """rsqrt(mean(x*x) + eps) of shape (n, 1), read by several kernels: its own kernel
    computes the mean (read at [i0, 0] where its loop i1 runs over one element)."""
    x = np.random.default_rng(10).standard_normal((6, 9)).astype(np.float32)

    def fn(x):
        r = tc.rsqrt((x * x).mean(1, keepdim=True) + 1e-5)
        return x * r, r + 1
    ks = _kernels(fn, x)
    assert len(ks) == 3 and _statements(ks[0].body, L.Reduce)
    _check_against_interp(fn, x)


@pytest.mark.parametrize("case", [
    ((256, 64), lambda x: x.sum(0)),                              # a bias gradient
    ((256, 64), lambda x: (x * (x > 0)).mean(0, keepdim=True)),   # producers inlined, mean's division
    ((3, 7, 32), lambda x: x.sum(1)),                             # a kept outer dim
    ((3, 7, 32), lambda x: x.amax((0, 1))),
    ((5, 2, 16), lambda x: x.prod(0)),
    ((6, 40), lambda x: (x > 0).all(0)),
    ((4, 20), lambda x: x.to(tc.int32).sum(0)),
    ((0, 16), lambda x: x.sum(0)), ((0, 16), lambda x: x.mean(0)),
])
def test_column_reductions_accumulate_row_by_row_in_the_output(case):
    """A reduction that keeps the innermost dims reads its input in memory order and
    accumulates into its output (contiguous, vectorizable), not one strided Reduce per
    output element; values as the interpreter's, in NumPy's summation order."""
    shape, fn = case
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    ks = _kernels(fn, x)
    assert not _statements(ks[-1].body, L.Reduce)
    out = ks[-1].buffers[-1].name
    updates = [s for s in _statements(ks[-1].body, L.Store) if s.buffer == out and "Load" in repr(s.value)]
    assert updates, "no accumulating store into the output"
    with np.errstate(all="ignore"):
        got, want = tc.trace(fn)(x), tc.trace(fn, backend="interp")(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6, equal_nan=True)


def test_a_column_reduction_over_the_outer_dim_is_never_parallel_over_it():
    x = np.ones((1 << 12, 64), np.float32)             # big enough for threads
    ks = _kernels(lambda x: x.sum(0), x)
    nests = [s for s in ks[-1].body if isinstance(s, L.Loop)]
    reading = [lp for lp in nests if lp.extent == 1 << 12]
    assert reading and not reading[0].parallel
    assert float(np.asarray(tc.trace(lambda x: x.sum(0))(x))[0]) == 4096.0


def _innermost_loops(body):
    for s in body:
        if isinstance(s, L.Loop):
            inner = [c for c in s.body if isinstance(c, L.Loop)]
            if inner or any(isinstance(c, (L.Reduce, L.Matmul)) for c in s.body):
                yield from _innermost_loops(s.body)
            else:
                yield s


@pytest.mark.parametrize("size,kernel,split", [(26, 3, True), (28, 5, True), (10, 3, False)])
def test_im2col_loops_split_by_window_row_and_divide_nothing_innermost(size, kernel, split):
    """The window matrix's column loop (oh*ow positions) becomes oh and ow loops when ow is
    at least a vector's worth (schedule/split.py), so the inner copy reads consecutive
    input elements: no floordiv or mod by ow on the innermost loop variable; the result is
    the same either way."""
    x = np.random.default_rng(size).standard_normal((2, 3, size, size)).astype(np.float32)
    fn = lambda x: tc.im2col(x, [kernel, kernel]) * 2.0      # noqa: E731
    [k] = _kernels(fn, x)
    ow = size - kernel + 1
    loops = list(_innermost_loops(k.body))
    assert loops and all((loop.extent == ow) == split for loop in loops)
    for loop in loops:
        var = L.Var(loop.var, L.INDEX)
        divides = [n for n in walk(loop.body) if isinstance(n, L.Binary) and n.fn in ("floordiv", "mod") and n.a == var]
        assert not divides if split else divides
    _check_against_interp(fn, x)
    np.testing.assert_array_equal(np.asarray(tc.trace(fn)(x)), np.asarray(tc.im2col(tc.tensor(x), [kernel, kernel])) * 2.0)


def test_recomputed_chains_go_in_one_round(monkeypatch):
    """rows.recomputable follows a chain of elementwise temps (a layer norm's inputs in a
    transformer's backward) to its end: schedule() then runs twice (the first schedule,
    one trial), not once per link, and finds what the rounds found."""
    from tracecomp.lower.schedule import scheduler as S
    tc.manual_seed(0)
    layer = tc.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True)
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    g = tc.trace(tc.grad(lambda x: layer(x).square().sum())).lower(x).optimized
    runs = []
    real_run = S.Scheduler.run
    monkeypatch.setattr(S.Scheduler, "run", lambda self: runs.append(1) or real_run(self))
    program = S.schedule(g)
    assert len(runs) <= 2
    assert run_program(program, [x])[0].shape == x.shape


@pytest.mark.parametrize("stride,padding", [(1, 0), (1, 1), (2, 1)])
def test_col2im_reads_the_window_matrix_by_guarded_loads(stride, padding):
    """fold (col2im) over a window matrix in memory reads each tap with a GuardedLoad at the
    unclamped index (a masked load of consecutive elements on the CPU, scf.if in MLIR) where
    the tap can fall outside; the same values as the interpreter, the checker and mlir-opt
    accept the kernel."""
    import subprocess
    from tracecomp.ir.mlir_tool import find_mlir_opt
    from tracecomp.lower.loops.check import check_kernel
    from tracecomp.lower.loops.printer import print_kernels
    x = np.random.default_rng(stride).standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((4, 3, 3, 3)).astype(np.float32)

    def fn(x, w):           # the input gradient of a conv: col2im of a product in memory
        return tc.grad(lambda x: tc.nn.functional.conv2d(x, w, stride=stride, padding=padding).square().sum())(x)
    p = _program(fn, x, w)
    guarded = [n for k in p.kernels for n in walk(k.body) if isinstance(n, L.GuardedLoad)]
    assert guarded and all(n.guard.dtype is tc.bool for n in guarded)
    _check_against_interp(fn, x, w, rtol=1e-4, atol=1e-4)      # float32 sums in other orders
    for k in p.kernels:
        check_kernel(k)
    mlir_opt = find_mlir_opt()
    if mlir_opt is None:
        pytest.skip("mlir-opt not found (not in /usr/lib/llvm-22/bin nor on PATH)")
    text = print_kernels(p.kernels)
    assert "scf.if" in text
    proc = subprocess.run([mlir_opt, "-", "-o", "-"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_an_assignment_of_one_value_runs_in_parallel_and_of_many_values_in_order():
    """Repeated indices: the last value written wins (as in NumPy), so a scatter of many
    values stays serial; when every element gets one value, any order gives that result."""
    n = 1 << 16
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    i = rng.integers(-n, n, n)                       # repeats, and negative indices
    v = rng.standard_normal(n).astype(np.float32)

    def one_value(x, i):
        y = x * 2
        y[i] = 3.0
        return y

    def many_values(x, i, v):
        y = x * 2
        y[i] = v
        return y
    for fn, args in ((one_value, (x, i)), (many_values, (x, i, v))):
        want = x * 2
        want[i] = 3.0 if fn is one_value else v
        np.testing.assert_array_equal(tc.trace(fn)(*args).numpy(), want)
        scatters = [loop for k in _kernels(fn, *args) for loop in k.body
                    if isinstance(loop, L.Loop) and loop.var.startswith("s")]
        assert [loop.parallel for loop in scatters] == [fn is one_value]


def test_a_value_used_several_times_by_one_op_is_inlined_but_a_chain_of_them_is_not_doubled():
    """`t * t` and the index wrap `where(t < 0, t + n, t)` are one kernel each (t's copies
    are computed at one position and merged by LLVM); in `t = t * t * 0.5` ten times, every
    other link gets a buffer, so the expression does not grow as 2^10."""
    a, b = (np.random.default_rng(k).standard_normal(1 << 16).astype(np.float32) for k in range(2))

    def square(a, b):
        t = a + b
        return t * t

    def wrap(a, b):
        t = a + b
        return tc.where(t < 0, t + 5, t)

    def chain(a):
        t = a
        for _ in range(10):
            t = t * t * 0.5
        return t
    for fn, args, kernels in ((square, (a, b), 1), (wrap, (a, b), 1), (chain, (a,), 5)):
        _check_against_interp(fn, *args)
        got = _kernels(fn, *args)
        assert len(got) == kernels and max(count_exprs(k.body) for k in got) < 40
