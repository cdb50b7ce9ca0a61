"""The Matmul statement end to end: the scheduler's statements for every torch.matmul case,
the packed CPU kernel (random shapes around the tile edges, transposed operands, batches,
all four dtypes) against NumPy, epilogue fusion, the kernel's vector FMAs, the loop
interpreter and mlir-opt on the same kernels, and the checker's messages.

Float results are compared with the float64 product within a bound that grows with k:
|got - exact| <= 2 k u (|a| @ |b|) (+ a few ulp of the epilogue), u the unit roundoff.
The speed comparison with NumPy is `python tests/lower/matmul_speed.py` (and the slow test
below, with TRACECOMP_SLOW=1); it prints, it never asserts.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracecomp as tc
from tracecomp.core.dtypes import DType
from tracecomp.core.errors import BackendError, IRError
from tracecomp.lower.loops import ir as L
from tracecomp.lower.llvm.codegen import codegen_kernels
from tracecomp.lower.loops.check import check_kernel
from tracecomp.lower.loops.interp import run_program
from tracecomp.lower.loops.printer import print_kernels
from tracecomp.lower.schedule.scheduler import schedule
from tracecomp.runtime import jit

from test_loops_ir import MLIR_OPT, mlir_opt_accepts

DTYPES = [np.float32, np.float64, np.int32, np.int64]
EDGES = [1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 97, 127, 128, 129, 130]
SIZES = st.one_of(st.sampled_from(EDGES), st.integers(1, 130))


def _inputs(seed: int, dtype, *shapes):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return [rng.integers(-9, 10, s).astype(dtype) for s in shapes]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _check(got, a, b, dtype, epilogue=lambda x: x):
    """`got` against epilogue(a @ b) (NumPy broadcasting rules, float64 reference)."""
    got = np.asarray(got)
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(got, epilogue(np.matmul(a, b)))
        return
    exact = epilogue(np.matmul(a.astype(np.float64), b.astype(np.float64)))
    k = a.shape[-1]
    u = np.finfo(dtype).eps / 2
    bound = 2 * k * u * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    bound = bound + 8 * u * np.abs(exact) + np.finfo(dtype).tiny
    assert got.dtype == dtype and got.shape == exact.shape
    worst = np.max(np.abs(got - exact) - bound, initial=-1.0)
    assert worst <= 0, f"error exceeds the bound by {worst}"


def _program(fn, *inputs):
    return schedule(tc.trace(fn).lower(*inputs).optimized)


# ---------------------------------------------------------------- against NumPy

@settings(max_examples=60, deadline=None)
@given(m=SIZES, n=SIZES, k=SIZES, dtype=st.sampled_from(DTYPES), ta=st.booleans(), tb=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_2d_products_match_numpy(m, n, k, dtype, ta, tb, seed):
    """Transposed operands are stored transposed and read through .mT (strides, no copy)."""
    a_stored, b_stored = _inputs(seed, dtype, (k, m) if ta else (m, k), (n, k) if tb else (k, n))
    got = tc.trace(lambda x, y: (x.mT if ta else x) @ (y.mT if tb else y))(a_stored, b_stored)
    _check(got, a_stored.T if ta else a_stored, b_stored.T if tb else b_stored, dtype)


BATCH_CASES = [((3,), (3,)), ((4, 3), (3,)), ((3,), (3, 5)), ((2, 4, 3), (3, 5)), ((4, 3), (2, 3, 5)),
               ((2, 1, 4, 3), (5, 3, 2)), ((3,), (2, 3, 5)), ((2, 4, 3), (3,)), ((1, 4, 3), (6, 3, 5)),
               ((3, 2, 9, 4), (3, 1, 4, 7))]


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(BATCH_CASES), scale=st.sampled_from([1, 5, 17, 40]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_batched_and_vector_cases_match_numpy(case, scale, dtype, seed):
    """Every torch.matmul rank combination; `scale` grows m, n and k past the tile sizes."""
    def grow(shape):
        return tuple(d * scale if d > 2 and i >= len(shape) - 2 else d for i, d in enumerate(shape))
    a, b = _inputs(seed, dtype, grow(case[0]), grow(case[1]))
    _check(tc.trace(tc.matmul)(a, b), a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_products_run_in_parallel_and_match_numpy(dtype):
    a, b = _inputs(1, dtype, (301, 257), (257, 203))
    _check(tc.trace(lambda x, y: x @ y)(a, b), a, b, dtype)
    a, b = _inputs(2, dtype, (3, 97, 130), (3, 130, 111))        # batch 3 over 2 threads
    _check(tc.trace(lambda x, y: x @ y)(a, b), a, b, dtype)


_THREADS_SCRIPT = """
import os, sys
import numpy as np
import tracecomp as tc
def threads_after(n):
    a = np.ones((n, n), np.float32)
    assert (np.asarray(tc.trace(lambda x, y: x @ y)(a, a)) == n).all()
    return len(os.listdir("/proc/self/task"))
start = len(os.listdir("/proc/self/task"))
small, large = threads_after(24), threads_after(300)
pid = os.fork()
if pid == 0:          # libgomp is not fork-safe: the child must take the serial path
    os._exit(0 if threads_after(256) == 1 else 3)
_, status = os.waitpid(pid, 0)
print(start, small, large, os.waitstatus_to_exitcode(status))
"""


def test_small_products_stay_on_one_thread_large_ones_use_libgomp_and_forks_work():
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    start, small, large, child = map(int, out.stdout.split())
    assert small == start and large > start and child == 0


def test_empty_and_operand_producers():
    a, b = np.ones((4, 0), np.float32), np.ones((0, 5), np.float32)
    np.testing.assert_array_equal(np.asarray(tc.trace(tc.matmul)(a, b)), np.zeros((4, 5), np.float32))
    a, b = _inputs(3, np.float32, (2, 3, 40), (120, 50))
    got = tc.trace(lambda x, y: (x * 2).reshape(6, 40) @ y[:40].exp())(a, b)
    _check(got, (a * 2).reshape(6, 40), np.exp(b[:40]), np.float32)


# ---------------------------------------------------------------- epilogue fusion

def _relu(x):
    return np.maximum(x, 0)


def test_relu_of_bias_add_is_one_kernel():
    x, w, bias = _inputs(4, np.float32, (70, 45), (45, 33), (33,))
    fn = lambda x, w, b: tc.relu(x @ w + b)     # noqa: E731
    [k] = _program(fn, x, w, bias).kernels
    assert re.fullmatch(r"k1_test_matmul_py\d+_matmul_add_relu", k.name) and k.body[0].epilogue is not None
    _check(tc.trace(fn)(x, w, bias), x, w, np.float32, lambda y: _relu(y + bias))


EPILOGUES = {
    "gelu-like": (lambda y, r: y * tc.sigmoid(1.702 * y), lambda y, r: y / (1 + np.exp(-1.702 * y))),
    "residual": (lambda y, r: (y + r) * 0.5, lambda y, r: (y + r) * 0.5),
    "tanh-square": (lambda y, r: tc.tanh(y) * tc.tanh(y) - r, lambda y, r: np.tanh(y) ** 2 - r),
    "column-bias": (lambda y, r: tc.exp(-tc.abs(y)) + r[..., :1], lambda y, r: np.exp(-np.abs(y)) + r[..., :1]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_elementwise_chains_fuse(name, dtype):
    ours, ref = EPILOGUES[name]
    x, w, r = _inputs(5, dtype, (2, 37, 29), (29, 41), (2, 37, 41))
    fn = lambda x, w, r: ours(x @ w, r)         # noqa: E731
    assert len(_program(fn, x, w, r).kernels) == 1
    _check(tc.trace(fn)(x, w, r), x, w, dtype, lambda y: ref(y, r))


def test_vector_and_integer_products_fuse_too():
    v, w, bias = _inputs(6, np.int64, (29,), (29, 40), (40,))
    fn = lambda v, w, b: tc.maximum(v @ w - b, b)      # noqa: E731
    assert len(_program(fn, v, w, bias).kernels) == 1
    _check(tc.trace(fn)(v, w, bias), v, w, np.int64, lambda y: np.maximum(y - bias, bias))


@pytest.mark.parametrize("fn", [lambda x, w: ((x @ w) + 1, (x @ w).sum()),     # another use
                                lambda x, w: ((x @ w).mT + 1, x @ w),            # read transposed, and used
                                lambda x, w: (x @ w).double() * 2,               # another dtype
                                lambda x, w: (x @ w, tc.relu(x @ w))],          # an output itself
                         ids=["two-uses", "transposed", "cast", "returned"])
def test_consumers_that_cannot_fuse_stay_separate(fn):
    x, w = _inputs(7, np.float32, (20, 20), (20, 20))
    kernels = _program(fn, x, w).kernels
    assert len(kernels) >= 2 and re.fullmatch(r"k0_test_matmul_py\d+_matmul", kernels[0].name)
    assert kernels[0].body[0].epilogue is None
    eager = tc.trace(fn, backend="interp")(x, w)
    got = tc.trace(fn)(x, w)
    for e, g in zip(*(o if isinstance(o, tuple) else (o,) for o in (eager, got))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-5)


def test_a_transposed_product_is_the_product_of_the_transposes_read_in_place():
    """(x @ w).mT + 1 computes w.mT @ x.mT (both read strided) with the + 1 fused: one
    kernel, no transpose kernel (the key gradient of attention has this form)."""
    x, w = _inputs(9, np.float32, (2, 20, 30), (30, 10))
    fn = lambda x, w: (x @ w).mT + 1      # noqa: E731
    [k] = _program(fn, x, w).kernels
    assert k.body[0].a.buffer == "in1" and k.body[0].b.buffer == "in0"
    np.testing.assert_allclose(tc.trace(fn)(x, w).numpy(), np.swapaxes(x @ w, -1, -2) + 1, rtol=1e-5, atol=1e-5)


def test_attention_scores_gradient_keeps_no_permute_of_a_permute():
    """The key's gradient of q @ k.mT is (g.mT @ q) after (q.mT @ g).mT is rewritten: the
    transposes compose, so the optimized graph reads q itself, and one kernel per product."""
    q, k = _inputs(11, np.float32, (2, 5, 3), (2, 5, 3))
    g = tc.trace(tc.grad(lambda q, k: (q @ k.transpose(-2, -1)).exp().sum(), argnums=(0, 1)))
    low = g.lower(q, k)
    permutes = [op for op in low.optimized.ops if op.name == "tc.permute"]
    assert all(p.operands[0].op is None or p.operands[0].op.name != "tc.permute" for p in permutes)
    gq, gk = (np.asarray(t) for t in g(q, k))
    e = np.exp(q @ np.swapaxes(k, -1, -2))
    np.testing.assert_allclose(gq, e @ k, rtol=1e-5)
    np.testing.assert_allclose(gk, np.swapaxes(e, -1, -2) @ q, rtol=1e-5)
    assert all(len([s for s in kern.body if type(s).__name__ == "Matmul"]) <= 1 for kern in low.program.kernels)


def test_linear_reads_the_transposed_weight_in_place_and_fuses_the_bias():
    x, w, bias = _inputs(8, np.float32, (16, 30), (12, 30), (12,))
    [k] = _program(tc.linear, x, w, bias).kernels
    s = k.body[0]
    assert s.b.buffer == "in1" and [st.value for st in s.b.strides] == [1, 30]
    _check(tc.trace(tc.linear)(x, w, bias), x, w.T, np.float32, lambda y: y + bias)


# ---------------------------------------------------------------- IR, interpreter, MLIR

def test_llvm_ir_uses_vector_fmas_of_the_targets_width():
    """The micro-kernel computes on vectors of the lanes the tiles chose for this target
    (AVX-512: 16 f32 / 8 f64; AVX2: 8 / 4; tests/lower/test_tiles.py forces each)."""
    from tracecomp.lower.schedule.tiles import tiles_for
    lanes32, lanes64 = tiles_for(DType.float32).lanes, tiles_for(DType.float64).lanes
    f32 = tc.trace(lambda x, y: x @ y).lower(*_inputs(0, np.float32, (64, 64), (64, 64))).as_text("llvm")
    assert f"<{lanes32} x float>" in f32 and f"@llvm.fma.v{lanes32}f32" in f32
    f64 = tc.trace(lambda x, y: x @ y).lower(*_inputs(0, np.float64, (64, 64), (64, 64))).as_text("llvm")
    assert f"@llvm.fma.v{lanes64}f64" in f64


FUSED = [(lambda x, w, b: tc.relu(x @ w + b), ((6, 5), (5, 4), (4,))),
         (lambda x, w, b: tc.tanh(x.mT @ w) * b, ((5, 6), (5, 4), (4,))),
         (lambda x, w, b: x @ w[0] + b, ((2, 3, 5), (2, 5, 4), (4,))),
         (lambda x, w, b: (x @ w + b).sum(), ((6, 5), (5,), (1,)))]


@pytest.mark.parametrize("case", range(len(FUSED)))
def test_interpreter_and_mlir_opt_agree_on_matmul_kernels(case):
    fn, shapes = FUSED[case]
    inputs = _inputs(case, np.float64, *shapes)
    program = _program(fn, *inputs)
    assert any(isinstance(k.body[0], L.Matmul) for k in program.kernels)
    want = np.asarray(tc.trace(fn, backend="interp")(*inputs))
    np.testing.assert_allclose(run_program(program, inputs)[0], want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tc.trace(fn)(*inputs)), want, rtol=1e-12)
    text = print_kernels(program.kernels)
    assert "memref.reinterpret_cast" in text
    if MLIR_OPT is not None:
        mlir_opt_accepts(text)


def _run_kernel(k: L.Kernel, arrays: dict, sizes=()) -> dict:
    """Compile and call one hand-built kernel on 64-byte aligned copies of `arrays`."""
    import ctypes
    from tracecomp.runtime.memory import aligned_empty
    lib = jit.compile_module(codegen_kernels([k], "hand"))
    fn = lib.function(k.name, None, *[ctypes.c_void_p] * len(k.buffers), *[ctypes.c_int64] * len(sizes))
    out = {}
    for b in k.buffers:
        out[b.name] = aligned_empty(np.shape(arrays[b.name]), b.dtype.np)
        out[b.name][...] = arrays[b.name]
    fn(*[out[b.name].ctypes.data for b in k.buffers], *sizes)
    return out


@pytest.mark.parametrize("dtype", [DType.float32, DType.float64, DType.int32])
def test_accumulate_adds_to_the_old_output_and_the_epilogue_sees_the_sum(dtype):
    """y = 2 * (y + a @ b), a (130 x 700) @ b (700 x 45): packed for floats (three K-blocks,
    the first one adding to y too), loop expansion for int32; the interpreter agrees."""
    m, n, k = 130, 45, 700
    two = L.Const(2 if dtype is DType.int32 else 2.0, dtype)
    s = L.Matmul(view("y", n, 1), view("a", k, 1), view("b", n, 1), m, n, k, accumulate=True,
                 epilogue=L.Binary("mul", L.Var("acc", dtype), two, dtype), index=("i", "j"),
                 workspace="w" if dtype.is_floating_point else None)
    from tracecomp.lower.schedule.tiles import workspace_elements
    size = workspace_elements(dtype, m, n, k, 1) if dtype.is_floating_point else 1
    bufs = [L.Buffer("a", dtype, (m, k), "input"), L.Buffer("b", dtype, (k, n), "input"),
            L.Buffer("y", dtype, (m, n), "output"), L.Buffer("w", dtype, (size,), "temp")]
    kern = L.Kernel("acc", bufs, [s])
    check_kernel(kern)
    a, b, y = _inputs(9, dtype.np.type, (m, k), (k, n), (m, n))
    arrays = {"a": a, "b": b, "y": y, "w": np.zeros(bufs[-1].shape, dtype.np)}
    got = _run_kernel(kern, arrays)["y"]
    _check(got, a, b, dtype.np.type, lambda p: 2 * (p + y))
    from tracecomp.lower.loops.interp import LoopInterpreter
    small = {"a": a[:3, :4].copy(), "b": b[:4, :5].copy(), "y": y[:3, :5].copy(), "w": arrays["w"]}
    s3 = dataclasses.replace(s, a=view("a", 4, 1), b=view("b", 5, 1), out=view("y", 5, 1), m=3, n=5, k=4)
    bufs3 = [dataclasses.replace(bf, shape=np.shape(small[bf.name])) for bf in bufs]
    LoopInterpreter(L.Kernel("acc3", bufs3, [s3]), small).run()
    _check(small["y"], a[:3, :4], b[:4, :5], dtype.np.type, lambda p: 2 * (p + y[:3, :5]))


def test_dynamic_sizes_use_the_loop_expansion():
    m, n, k = (L.Var(x, L.INDEX) for x in "mnk")
    s = L.Matmul(L.View("y", ic(0), (n, ic(1))), L.View("a", ic(0), (k, ic(1))),
                 L.View("b", ic(0), (n, ic(1))), m, n, k, index=("i", "j"))
    bufs = [L.Buffer("a", F32, (m, k), "input"), L.Buffer("b", F32, (k, n), "input"),
            L.Buffer("y", F32, (m, n), "output")]
    kern = L.Kernel("dyn", bufs, [s], ["m", "n", "k"])
    check_kernel(kern)
    if MLIR_OPT is not None:
        mlir_opt_accepts(print_kernels([kern]))
    a, b = _inputs(10, np.float32, (37, 21), (21, 19))
    got = _run_kernel(kern, {"a": a, "b": b, "y": np.zeros((37, 19), np.float32)}, sizes=(37, 19, 21))["y"]
    _check(got, a, b, np.float32)


# ---------------------------------------------------------------- the checker

F32, I32 = DType.float32, DType.int32


def ic(v):
    return L.Const(v, L.INDEX)


def view(buf, *strides, offset=0):
    return L.View(buf, ic(offset), tuple(ic(s) for s in strides))


def kernel(s=None, buffers=None, wrap=None, **changes):
    """y (4x3) = a (4x5) @ b (5x3) with a workspace, changed by `changes`."""
    base = L.Matmul(view("y", 3, 1), view("a", 5, 1), view("b", 3, 1), 4, 3, 5, index=("i", "j"), workspace="w")
    s = dataclasses.replace(base, **changes)
    bufs = buffers or [L.Buffer("a", F32, (4, 5), "input"), L.Buffer("b", F32, (5, 3), "input"),
                       L.Buffer("y", F32, (4, 3), "output"), L.Buffer("w", F32, (4096,), "temp"),
                       L.Buffer("c", I32, (4, 3), "output")]
    return L.Kernel("bad", bufs, wrap(s) if wrap else [s])


acc = L.Var("acc", F32)
BAD = {
    "rank": (kernel(a=view("a", 5, 1, 0)), "has 3 strides; it needs 2"),
    "outside": (kernel(b=view("b", 3, 1, offset=1)), "reaches flat elements 1..15, outside its 15 elements"),
    "dtype": (kernel(out=view("c", 3, 1)), "holds float32 but out ('c') holds int32"),
    "alias": (kernel(out=view("a", 5, 1)), "whose role is 'input' (read-only)"),
    "overlap": (kernel(out=view("y", 1, 1)), "maps two output elements to one memory element"),
    "workspace": (kernel(workspace="c"), "must be a writable 1-D float32 buffer"),
    "epilogue-dtype": (kernel(epilogue=L.Const(1, I32)), "epilogue has dtype int32, but out holds float32"),
    "epilogue-reads-out": (kernel(epilogue=L.Load("y", (L.Var("i", L.INDEX), L.Var("j", L.INDEX)), F32)),
                           "reads 'y'; it may read neither out nor the workspace"),
    "unknown-name": (kernel(epilogue=L.Binary("add", acc, L.Var("z", F32), F32)), "'z' is used before"),
    "index-names": (kernel(index=("i",)), "must be none or 2"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_checker_rejects_broken_matmuls(name):
    k, message = BAD[name]
    with pytest.raises(IRError) as info:
        check_kernel(k)
    assert str(info.value).startswith("kernel 'bad' at ") and message in str(info.value)


def test_checker_accepts_an_epilogue_over_names_and_loads():
    bias = L.Buffer("bias", F32, (3,), "input")
    k = kernel(epilogue=L.Binary("add", acc, L.Load("bias", (L.Var("j", L.INDEX),), F32), F32))
    k.buffers.append(bias)
    check_kernel(k)


def test_a_workspace_too_small_is_a_backend_error():
    k = kernel(buffers=[L.Buffer("a", F32, (4, 5), "input"), L.Buffer("b", F32, (5, 3), "input"),
                        L.Buffer("y", F32, (4, 3), "output"), L.Buffer("w", F32, (16,), "temp")])
    check_kernel(k)
    with pytest.raises(BackendError, match="workspace 'w' holds 16 elements, a thread needs"):
        jit.compile_module(codegen_kernels([k], "small"))


# ---------------------------------------------------------------- speed (prints only)

@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TRACECOMP_SLOW"), reason="timing run (~30 s): set TRACECOMP_SLOW=1")
def test_print_speed_against_numpy():
    """GFLOP/s of 1024^3 f32 and 512^3 f64 next to NumPy's, in a child process without
    the OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE overrides (so OpenBLAS picks its own kernels)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    script = os.path.join(os.path.dirname(__file__), "matmul_speed.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    print(out.stdout, out.stderr)
    assert out.returncode == 0


def test_a_convolution_with_bias_and_relu_is_its_window_matrix_and_one_fused_product():
    """conv2d reads the weight reshaped in place and its bias and ReLU, applied to the product
    reshaped to (N, C, H, W), fuse into the matmul: two kernels (im2col, matmul)."""
    x, w, b = _inputs(10, np.float32, (2, 3, 7, 6), (4, 3, 3, 2), (4,))
    fn = lambda x, w, b: tc.relu(tc.conv2d(x, w, b))     # noqa: E731
    kernels = _program(fn, x, w, b).kernels
    assert len(kernels) == 2 and kernels[1].body[0].epilogue is not None
    assert kernels[1].body[0].a.buffer == "in1"            # the weight, not a copy of it
    torch = pytest.importorskip("torch")
    want = torch.relu(torch.nn.functional.conv2d(*map(torch.from_numpy, (x, w, b)))).numpy()
    np.testing.assert_allclose(tc.trace(fn)(x, w, b).numpy(), want, rtol=1e-5, atol=1e-5)


def test_tile_rows_of_cheap_epilogues_unroll_and_of_math_epilogues_do_not():
    """A whole tile's row loop is unrolled for a cheap epilogue (bias, ReLU), not for one
    applying a math function, whose constants each unrolled row re-hoisted (llvm/gemm/matmul.py)."""
    x, w, bias = _inputs(12, np.float32, (64, 48), (48, 64), (64,))
    cheap = str(tc.trace(lambda x, w, b: tc.relu(x @ w + b)).lower(x, w, bias).cpu_module)    # before LLVM's passes
    heavy = str(tc.trace(lambda x, w, b: tc.erf(x @ w) * b).lower(x, w, bias).cpu_module)
    assert "llvm.loop.unroll.full" in cheap and "llvm.loop.unroll.full" not in heavy
    np.testing.assert_allclose(np.asarray(tc.trace(lambda x, w, b: tc.erf(x @ w) * b)(x, w, bias)),
                               np.asarray(tc.erf(tc.tensor(x @ w))) * bias, rtol=1e-4, atol=1e-5)   # f32 sums in another order


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_reshape_is_read_in_place(dtype):
    """A weight gradient's pattern: stacked rows (T, B, n) merged into one matrix and read
    transposed.  The product reads the buffer through strides; no copy kernel."""
    xs, ys = _inputs(7, dtype, (5, 6, 40), (5, 6, 33))
    fn = lambda a, b: a.reshape(30, 40).T @ b.reshape(30, 33)     # noqa: E731
    [k] = _program(fn, xs, ys).kernels
    assert "matmul" in k.name and "permute" not in k.name
    got = np.asarray(tc.trace(fn)(xs, ys))
    want = xs.reshape(30, 40).astype(np.float64).T @ ys.reshape(30, 33)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


def test_transposed_computed_operand_is_computed_in_its_own_order():
    """A weight gradient of a computed value (exp(a) * 2, stacked rows merged and read
    transposed) computes the value in its own order, once, for both products; the product
    reads it transposed in place.  A copy kernel of the transpose read every input across
    its rows (Llama's LM-head gradient: 30% of its training step)."""
    xs, ys, w = _inputs(8, np.float32, (5, 6, 40), (5, 6, 33), (40, 7))
    fn = lambda a, b, w: ((e := (tc.exp(a) * 2).reshape(30, 40)).T @ b.reshape(30, 33),   # noqa: E731
                          e @ w)
    program = _program(fn, xs, ys, w)
    ops = {k.name: [o.name for o in program.kernel_ops[k.name]] for k in program.kernels}
    assert len(program.kernels) == 3, ops
    assert all("tc.permute" not in names for names in ops.values() if "tc.exp" in names), ops
    got = tc.trace(fn)(xs, ys, w)
    e = np.exp(xs.astype(np.float64)).reshape(30, 40) * 2
    np.testing.assert_allclose(np.asarray(got[0]), e.T @ ys.reshape(30, 33), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got[1]), e @ w, rtol=1e-5, atol=1e-4)
