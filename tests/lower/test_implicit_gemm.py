"""conv2d as implicit GEMM: the packed matmul reads the window matrix in the input
(loops.ir.Windows, llvm/gemm/microkernel.py's pack_windows) instead of im2col's copy.
Checked against NumPy in float64, over shapes where B's micro-panels straddle output rows,
padding, stride, dilation, groups and odd sizes."""
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.llvm.gemm.matmul import cpu_body, reads_windows
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.check import check_kernel
from tracecomp.lower.loops.interp import run_program


def conv_ref(x, w, b, stride, padding, dilation, groups):
    """float64 cross-correlation, one group at a time."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oc, oh, ow))
    og = oc // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for ki in range(kh):
            for kj in range(kw):
                tap = xs[:, :, ki * dh: ki * dh + sh * (oh - 1) + 1: sh, kj * dw: kj * dw + sw * (ow - 1) + 1: sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", tap, w[g * og:(g + 1) * og, :, ki, kj])
    return out + (0 if b is None else b.astype(np.float64)[:, None, None])


CASES = [
    # (N, C, H, W), (O, kh, kw), stride, padding, dilation, groups
    ((4, 32, 26, 26), (64, 3, 3), (1, 1), (0, 0), (1, 1), 1),      # W7's conv, smaller batch
    ((2, 8, 9, 37), (40, 3, 3), (1, 1), (0, 0), (1, 1), 1),        # rows longer than a micro-panel
    ((3, 5, 11, 7), (17, 3, 2), (1, 1), (1, 1), (1, 1), 1),        # odd sizes, padding
    ((2, 6, 15, 16), (24, 3, 3), (2, 2), (1, 1), (1, 1), 1),       # stride 2: gathers only
    ((2, 4, 9, 70), (8, 3, 3), (2, 2), (1, 1), (1, 1), 1),         # stride 2: whole vectors in a row
    ((1, 8, 21, 35), (32, 3, 3), (2, 2), (0, 0), (1, 1), 1),      # ... up to the input's last element
    ((2, 7, 14, 13), (12, 3, 3), (1, 1), (2, 2), (2, 2), 1),       # dilation 2
    ((2, 8, 12, 12), (16, 3, 3), (1, 2), (0, 1), (1, 1), 2),       # groups, uneven stride/padding
    ((1, 16, 20, 20), (32, 5, 5), (1, 1), (2, 2), (1, 1), 4),
    ((3, 33, 10, 10), (8, 1, 1), (1, 1), (0, 0), (1, 1), 1),       # 1x1
]


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CASES)
def test_conv2d_matches_float64(xs, ws, stride, padding, dilation, groups):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((ws[0], xs[1] // groups, ws[1], ws[2])) / 4).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    fn = tc.trace(lambda x, w, b: tc.relu(tc.conv2d(x, w, b, stride, padding, dilation, groups)))
    got = np.asarray(fn(x, w, b))
    want = np.maximum(conv_ref(x, w, b, stride, padding, dilation, groups), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(xs[1] * ws[1] * ws[2]))


def test_float64():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 8, 9, 37))
    w = rng.standard_normal((40, 8, 3, 3))
    b = rng.standard_normal(40)
    fn = tc.trace(lambda x, w, b: tc.conv2d(x, w, b, 1, 1))
    assert _windowed(fn.lower(x, w, b).program.kernels)
    np.testing.assert_allclose(np.asarray(fn(x, w, b)), conv_ref(x, w, b, (1, 1), (1, 1), (1, 1), 1), rtol=1e-10, atol=1e-10)


def _windowed(kernels):
    return [s for k in kernels for s in k.body if isinstance(s, L.Matmul) and s.b_windows is not None]


def test_product_reads_the_input_in_place():
    """The Matmul carries the windows, the CPU skips im2col's fill, and the
    portable program (the fill, then the product of the filled matrix) still interprets
    to the same values."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    low = tc.trace(lambda x, w, b: tc.conv2d(x, w, b)).lower(x, w, b)
    program = low.program
    (s,) = _windowed(program.kernels)
    kernel = next(k for k in program.kernels if s in k.body)
    check_kernel(kernel)
    assert reads_windows(kernel, s)
    assert cpu_body(kernel) == [s]                      # no im2col fill on the CPU
    assert len(kernel.body) > 1                         # ...which other code generators run
    assert s.b_windows.buffer == program.inputs[0]
    assert "pack_windows" in low.as_text("llvm")
    want = conv_ref(x, w, b, (1, 1), (0, 0), (1, 1), 1)
    (got,) = run_program(program, [x, w, b])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_train_step_gradients():
    """The train step's weight gradient reads the window matrix as well: it is materialized
    once for both products (no windows), and the gradients are right."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)

    def loss(w, x):
        return tc.sum(tc.conv2d(x, w, None, 1, 1) ** 2)
    step = tc.trace(tc.value_and_grad(loss))
    assert not _windowed(step.lower(w, x).program.kernels)
    value, grad = step(w, x)
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    want = (torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), tw, None, 1, 1) ** 2).sum()
    want.backward()
    np.testing.assert_allclose(float(np.asarray(value)), want.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_gpu_emulator_reads_the_filled_matrix():
    """The PTX path ignores the windows: it fills the window matrix and multiplies it."""
    from tracecomp.runtime.cuda.emulator import EmulatedContext
    from tracecomp.runtime.cuda.runner import CudaProgram
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((9, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32)
    low = tc.trace(lambda x, w, b: tc.conv2d(x, w, b, 1, 1)).lower(x, w, b)
    assert _windowed(low.program.kernels)
    (got,) = CudaProgram(low.program, EmulatedContext()).on_host([x, w, b])
    np.testing.assert_allclose(got, conv_ref(x, w, b, (1, 1), (1, 1), (1, 1), 1), rtol=1e-4, atol=1e-4)


def test_computed_inputs():
    """The input is computed (a row softmax, deferred by the row fusion; a softmax over
    channels, padded): it is materialized, or copied with its padding, before the product."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 10, 10)).astype(np.float32)
    w = rng.standard_normal((16, 6, 3, 3)).astype(np.float32)

    def f(x, w):
        return tc.conv2d(tc.softmax(x, -1), w), tc.conv2d(tc.softmax(x, 1), w, None, 1, 1)
    fn = tc.trace(f)
    assert len(_windowed(fn.lower(x, w).program.kernels)) == 2
    got = fn(x, w)
    tx, tw = torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64)
    want = (torch.nn.functional.conv2d(torch.softmax(tx, -1), tw),
            torch.nn.functional.conv2d(torch.softmax(tx, 1), tw, None, 1, 1))
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), r.numpy(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- half inputs (schedule/tiles.py: half_path)

HALF_CASES = [
    # (N, C, H, W), (O, kh, kw), stride, padding, dilation, groups
    ((2, 8, 9, 37), (40, 3, 3), (1, 1), (0, 0), (1, 1), 1),        # micro-panels across output rows
    ((3, 5, 11, 7), (17, 3, 2), (1, 1), (1, 1), (1, 1), 1),        # ragged channels, padding
    ((2, 6, 15, 16), (24, 3, 3), (2, 2), (1, 1), (1, 1), 1),       # stride 2: element by element
    ((2, 7, 14, 13), (12, 3, 3), (1, 1), (2, 2), (2, 2), 1),       # dilation 2, odd K (63)
    ((2, 8, 12, 12), (18, 3, 3), (1, 2), (0, 1), (1, 1), 2),       # groups, uneven stride/padding
]


@pytest.fixture(params=["dpbf16ps", "widen"])
def half_path(request):
    """The half matmul path forced (tuning key, restored after); dpbf16ps runs only with
    AVX512-BF16 (its assembly is checked in test_amx_matmul.py's way elsewhere)."""
    from tracecomp.lower import hostcpu
    from tracecomp.lower.schedule import tiles
    from tracecomp.runtime import tuning
    if request.param == "dpbf16ps" and not hostcpu.host_target().has("avx512f"):
        pytest.skip("the dpbf16ps path needs AVX-512 (avx512f)")
    tuning.ensure_tuned()
    before = hostcpu.tuned()
    hostcpu.set_tuned({**before, tiles.HALF_PATH_KEY: request.param})
    yield request.param
    hostcpu.set_tuned(before)


def _windowed_kernel(program):
    """(kernel, Matmul) of the program's one product that reads windows."""
    (found,) = [(k, s) for k in program.kernels for s in k.body if isinstance(s, L.Matmul) and s.b_windows is not None]
    return found


def _half_inputs(xs, ws, groups, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(tc.bfloat16.np)
    w = (rng.standard_normal((ws[0], xs[1] // groups, ws[1], ws[2])) / 4).astype(tc.bfloat16.np)
    return x, w


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", HALF_CASES)
def test_bf16_conv2d_on_each_half_path(half_path, xs, ws, stride, padding, dilation, groups):
    """A bf16 conv's window matrix packed straight from the bf16 input (K-pairs or widened),
    against torch's float32 conv of the same bf16 values: within one bf16 ulp of the
    result (the float32 sum rounded once) plus float32 summation error."""
    from tracecomp.lower import hostcpu
    from tracecomp.lower.schedule import tiles
    torch = pytest.importorskip("torch")
    missing = tiles.missing_for(half_path)
    if missing:
        pytest.skip(f"the host lacks {', '.join(missing)}")
    x, w = _half_inputs(xs, ws, groups, sum(xs) + sum(ws))
    fn = tc.trace(lambda x, w: tc.conv2d(x, w, None, stride, padding, dilation, groups))
    lowered = fn.lower(x, w)
    kernel, product = _windowed_kernel(lowered.cpu_program)
    assert tiles.half_path(tc.bfloat16, tc.bfloat16) == half_path
    assert kernel.buffer(product.a.buffer).dtype == kernel.buffer(product.b_windows.buffer).dtype == tc.bfloat16
    got = np.asarray(fn(x, w))
    assert got.dtype == tc.bfloat16.np
    tx, tw = (torch.from_numpy(v.astype(np.float32)) for v in (x, w))
    want = torch.nn.functional.conv2d(tx, tw, None, stride, padding, dilation, groups).double().numpy()
    scale = torch.nn.functional.conv2d(tx.abs(), tw.abs(), None, stride, padding, dilation, groups).double().numpy()
    ulp = np.spacing(np.abs(want).astype(tc.bfloat16.np)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want) <= ulp + 1e-6 * scale), np.abs(got - want).max()
    if half_path == "dpbf16ps" and hostcpu.detected_target().has("avx512bf16"):
        assert "vdpbf16ps" in lowered.as_text("asm")


def test_bf16_conv2d_packs_from_the_bf16_input(half_path):
    """No float32 buffer the size of the input (or of its zero-padded copy): the padding
    copy stays bf16 and the product's kernel reads it, 2-byte elements, through its
    windows; the packing function is the half one (LLVM IR)."""
    x, w = _half_inputs((2, 8, 10, 10), (16, 3, 3), 1, 0)
    lowered = tc.trace(lambda x, w: tc.conv2d(x, w, None, 1, 1)).lower(x, w)
    program = lowered.cpu_program
    sizes = {x.size, 2 * 8 * 12 * 12}
    for k in program.kernels:
        for buf in k.buffers:
            assert not (buf.dtype == tc.float32 and int(np.prod(buf.shape)) in sizes), (k.name, buf)
    kernel, product = _windowed_kernel(program)
    windows = product.b_windows
    assert kernel.buffer(windows.buffer).dtype == tc.bfloat16 and kernel.buffer(windows.buffer).shape == (2, 8, 12, 12)
    layout = "pairs" if half_path == "dpbf16ps" else "widen"
    assert f"tracecomp.matmul.pack_windows.bfloat16.{layout}." in lowered.as_text("llvm")


def test_bf16_conv2d_gradients_under_autocast(half_path):
    """A conv2d under tc.autocast and its gradients (input, weight, bias) as
    torch.autocast's, within bf16's tolerance; all three products on the half path."""
    from tracecomp.lower.schedule import tiles
    torch = pytest.importorskip("torch")
    if tiles.missing_for(half_path):
        pytest.skip(f"the host lacks {', '.join(tiles.missing_for(half_path))}")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 11, 13)).astype(np.float32)
    w = (rng.standard_normal((34, 8, 3, 3)) / 4).astype(np.float32)
    b = rng.standard_normal(34).astype(np.float32)

    def loss(x, w, b):
        with tc.autocast(tc.bfloat16):
            y = tc.conv2d(x, w, b, (1, 2), 1, 1, 2)
        return (y.float() * y.float()).mean()
    step = tc.trace(lambda *a: tc.grad(loss, argnums=(0, 1, 2))(*a))
    # forward, input and weight gradients: each product reads bf16 operands (the window
    # matrix, materialized once for the forward and the weight gradient, in bf16)
    products = [(k, s) for k in step.lower(x, w, b).cpu_program.kernels for s in k.body if isinstance(s, L.Matmul)]
    assert len(products) == 3
    for k, s in products:
        b_buffer = s.b_windows.buffer if s.b_windows is not None else s.b.buffer
        assert k.buffer(s.a.buffer).dtype == k.buffer(b_buffer).dtype == tc.bfloat16, (k.name, s)
    got = [np.asarray(g) for g in step(x, w, b)]
    tx, tw, tb = (torch.from_numpy(v).requires_grad_() for v in (x, w, b))
    with torch.autocast("cpu", torch.bfloat16):
        y = torch.nn.functional.conv2d(tx, tw, tb, (1, 2), 1, 1, 2)
    (y.float() * y.float()).mean().backward()
    for g, t in zip(got, (tx, tw, tb)):
        want = t.grad.numpy()
        assert g.dtype == np.float32
        assert np.abs(g - want).max() <= 2e-2 * np.abs(want).max(), np.abs(g - want).max()


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16], ids=str)
def test_half_conv1d_and_float16_take_the_half_windows(half_path, d):
    """conv1d (a conv2d of height 1) of half inputs packs the half windows too; float16
    has no K-pair path here, so it converts in the packing whatever bf16's path is."""
    from tracecomp.lower.schedule import tiles
    torch = pytest.importorskip("torch")
    taken = tiles.half_path(d, d)
    if tiles.missing_for(taken):
        pytest.skip(f"the host lacks {', '.join(tiles.missing_for(taken))}")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 10, 70)).astype(d.np)
    w = (rng.standard_normal((36, 5, 3)) / 4).astype(d.np)
    fn = tc.trace(lambda x, w: tc.conv1d(x, w, None, 2, 1, 1, 2))
    kernel, product = _windowed_kernel(fn.lower(x, w).cpu_program)
    assert kernel.buffer(product.b_windows.buffer).dtype == d
    layout = "pairs" if taken in ("dpbf16ps", "amx", "amx-fp16") else "widen"
    assert f"tracecomp.matmul.pack_windows.{d.label}.{layout}." in fn.lower(x, w).as_text("llvm")
    got = np.asarray(fn(x, w)).astype(np.float64)
    tx, tw = (torch.from_numpy(v.astype(np.float32)) for v in (x, w))
    want = torch.nn.functional.conv1d(tx, tw, None, 2, 1, 1, 2).double().numpy()
    scale = torch.nn.functional.conv1d(tx.abs(), tw.abs(), None, 2, 1, 1, 2).double().numpy()
    ulp = np.spacing(np.abs(want).astype(d.np)).astype(np.float64)
    assert np.all(np.abs(got - want) <= ulp + 1e-6 * scale), np.abs(got - want).max()


def test_half_windows_packing_names_an_unknown_layout():
    import llvmlite.ir as ir
    from tracecomp.core.errors import BackendError
    from tracecomp.lower.llvm.gemm.halfwindows import pack_half_windows_function
    with pytest.raises(BackendError, match="layout 'rows' is not one of"):
        pack_half_windows_function(ir.Module(), tc.bfloat16, 32, "rows")
