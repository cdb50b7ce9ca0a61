"""conv as implicit GEMM with run-time sizes (issue 36): with a dynamic N, H and W (or every
dim dynamic) the product still reads the windows in the input, through offset tables the
kernel fills per call (loops.ir.Windows.row_table/column_table), instead of im2col's
matrix.  Checked at three sizes against eager tracecomp and the static compile."""
import dataclasses

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import IRError
from tracecomp.lower.llvm.gemm import matmul as gemm
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.check import check_kernel
from tracecomp.lower.loops.walk import buffers_written

NHW = {"x": {0: "n", 2: "h", 3: "w"}}
SIZES = [(2, 11, 13), (3, 7, 9), (4, 16, 10)]        # (N, H, W); the first compile sees H != W (1 would specialize)

CASES = {
    # name: (C, O, (kh, kw), conv2d's stride, padding, dilation, groups)
    "padding 1": (8, 16, (3, 3), 1, 1, 1, 1),
    "stride 2": (6, 12, (3, 3), 2, 1, 1, 1),
    "dilation 2": (5, 16, (3, 2), 1, (2, 1), 2, 1),
    "same": (4, 16, (3, 5), 1, "same", 1, 1),
    "groups": (8, 32, (3, 3), (1, 2), (0, 1), 1, 2),
}


def _inputs(c, o, k, groups, size, seed=0):
    n, h, w = size
    rng = np.random.default_rng([seed, n, h, w])
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = (rng.standard_normal((o, c // groups, *k)) / 4).astype(np.float32)
    return x, weight


def _run_time_windows(program):
    """(kernel, Matmul) of each product that reads windows through run-time tables, on the CPU."""
    return [(k, s) for k in program.kernels for s in k.body
            if isinstance(s, L.Matmul) and s.b_windows is not None and not s.b_windows.is_static()
            and gemm.reads_windows(k, s)]


def _reads_in_place(program) -> None:
    """Every windowed product is CPU-read in place: checked, tables named, and no statement
    of the CPU's body fills its window matrix (im2col is not materialized)."""
    found = _run_time_windows(program)
    assert found
    for kernel, s in found:
        check_kernel(kernel)
        w = s.b_windows
        assert kernel.buffer(w.row_table).dtype == kernel.buffer(w.column_table).dtype == tc.int32
        body = gemm.cpu_body(kernel)
        assert not any(s.b.buffer in buffers_written(st) for st in body[:-1])
        assert len(body) < len(kernel.body)                  # the fill is there for other code generators


def _torch_conv(x, w, *args):
    """PyTorch's conv2d in float64: a reference that shares no code with tracecomp's."""
    torch = pytest.importorskip("torch")
    return torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, *args).numpy()


@pytest.mark.parametrize("case", CASES)
def test_conv2d_with_dynamic_batch_height_and_width(case):
    c, o, k, stride, padding, dilation, groups = CASES[case]

    def f(x, w):
        return tc.conv2d(x, w, None, stride, padding, dilation, groups)
    dynamic = tc.trace(f, dynamic=NHW)
    static = tc.trace(f)
    for i, size in enumerate(SIZES):
        x, w = _inputs(c, o, k, groups, size)
        got = np.asarray(dynamic(x, w))
        want = np.asarray(f(tc.tensor(x), tc.tensor(w)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{case} at {size}")
        np.testing.assert_allclose(got, _torch_conv(x, w, stride, padding, dilation, groups), rtol=1e-4, atol=1e-4)
        if i == 0:
            _reads_in_place(dynamic.lower(x, w).cpu_program)
            np.testing.assert_allclose(got, np.asarray(static(x, w)), rtol=1e-5, atol=1e-5)
    assert len(dynamic.signatures) == 1


def test_every_dim_dynamic_kernel_and_channels_included():
    """dynamic=True: the channel counts and the kernel size are run-time sizes too."""
    def f(x, w):
        return tc.relu(tc.conv2d(x, w, None, 1, 1))
    fn = tc.trace(f, dynamic=True)
    for size in SIZES:
        x, w = _inputs(6, 10, (3, 3), 1, size, seed=1)
        np.testing.assert_allclose(np.asarray(fn(x, w)), np.asarray(f(tc.tensor(x), tc.tensor(w))),
                                   rtol=1e-4, atol=1e-4, err_msg=str(size))
    _reads_in_place(fn.lower(x, w).cpu_program)
    assert len(fn.signatures) == 1


def test_conv1d_with_a_dynamic_length():
    def f(x, w):
        return tc.conv1d(x, w, None, 2, 1, 1, 2)
    fn = tc.trace(f, dynamic={"x": {0: "n", 2: "l"}})
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((32, 5, 3)) / 4).astype(np.float32)
    for n, length in [(2, 33), (3, 17), (4, 64)]:
        x = rng.standard_normal((n, 10, length)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(fn(x, w)), np.asarray(f(tc.tensor(x), tc.tensor(w))),
                                   rtol=1e-4, atol=1e-4, err_msg=str((n, length)))
    _reads_in_place(fn.lower(x, w).cpu_program)


def test_input_gradient_with_dynamic_sizes():
    """The input gradient's program (its forward product reads the windows, as in the static
    compile) at three sizes, against eager tracecomp's gradient."""
    def loss(x, w):
        return tc.sum(tc.tanh(tc.conv2d(x, w, None, 2, 1)) ** 2)
    step = tc.trace(tc.grad(loss), dynamic=NHW)
    for size in SIZES:
        x, w = _inputs(4, 16, (3, 3), 1, size, seed=2)
        want = np.asarray(tc.grad(loss)(tc.tensor(x), tc.tensor(w)))
        np.testing.assert_allclose(np.asarray(step(x, w)), want, rtol=1e-4, atol=1e-5, err_msg=str(size))
    program = step.lower(x, w).cpu_program
    _reads_in_place(program)
    assert len(_run_time_windows(program)) == \
        len([s for k in tc.trace(tc.grad(loss)).lower(x, w).cpu_program.kernels for s in k.body
             if isinstance(s, L.Matmul) and s.b_windows is not None])


def test_weight_and_input_gradients_with_dynamic_sizes():
    """Both gradients (the weight gradient reads the window matrix: it is materialized once,
    as in the static compile) match eager at three sizes."""
    def loss(x, w):
        return tc.sum(tc.conv2d(x, w, None, 1, "same", 1, 2) ** 2)
    step = tc.trace(tc.grad(loss, argnums=(0, 1)), dynamic=NHW)
    for size in SIZES:
        x, w = _inputs(4, 6, (3, 3), 2, size, seed=3)
        want = tc.grad(loss, argnums=(0, 1))(tc.tensor(x), tc.tensor(w))
        for g, r in zip(step(x, w), want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4, err_msg=str(size))


def test_offsets_past_32_bits_fill_the_window_matrix(monkeypatch):
    """Where a call's offsets would not fit the i32 tables (here: a limit lowered to force
    it), the kernel fills the window matrix and multiplies it, and the answer is the same."""
    monkeypatch.setattr(gemm, "TABLE_LIMIT", 200)       # read when the kernel is generated
    def f(x, w):
        return tc.conv2d(x, w, None, 1, 1)
    with tc.compile_cache.scoped(enabled=False):        # (a cached kernel would be the in-place one)
        fn = tc.trace(f, dynamic=NHW)
        for size in [(2, 3, 4), (2, 9, 11)]:            # below the limit, then past it
            x, w = _inputs(3, 8, (3, 3), 1, size, seed=5)
            np.testing.assert_allclose(np.asarray(fn(x, w)), np.asarray(f(tc.tensor(x), tc.tensor(w))),
                                       rtol=1e-4, atol=1e-4, err_msg=str(size))


def test_run_time_windows_need_their_tables():
    x, w = _inputs(3, 8, (3, 3), 1, SIZES[0])
    program = tc.trace(lambda x, w: tc.conv2d(x, w), dynamic=NHW).lower(x, w).cpu_program
    ((kernel, s),) = _run_time_windows(program)
    bare = dataclasses.replace(s, b_windows=dataclasses.replace(s.b_windows, row_table=None))
    with pytest.raises(IRError, match="int32 table"):
        check_kernel(dataclasses.replace(kernel, body=kernel.body[:-1] + [bare]))


def test_bf16_windows_with_dynamic_sizes():
    """A bf16 conv (padded: the zero-bordered copy stays bf16) packs its half windows through
    the run-time tables, and matches the static compile (the same sums)."""
    def f(x, w):
        return tc.conv2d(x, w, None, 1, 1)
    dynamic, static = tc.trace(f, dynamic=NHW), tc.trace(f)
    for size in SIZES[:2]:
        x, w = (v.astype(tc.bfloat16.np) for v in _inputs(8, 16, (3, 3), 1, size, seed=6))
        got, want = (np.asarray(g(x, w)).astype(np.float64) for g in (dynamic, static))
        ulp = np.spacing(np.abs(want).astype(tc.bfloat16.np)).astype(np.float64)
        assert np.all(np.abs(got - want) <= ulp), (size, np.abs(got - want).max())
    program = dynamic.lower(x, w).cpu_program
    _reads_in_place(program)
    ((kernel, s),) = _run_time_windows(program)
    assert kernel.buffer(s.b_windows.buffer).dtype == tc.bfloat16


def test_grouped_conv_with_every_dim_dynamic_compiles_once_for_every_image_size():
    """dynamic=True on a grouped conv: the shape rule needs in_channels == groups * the
    weight's dim 1, and out_channels // groups exactly, so those sizes are fixed (a retrace
    asks for them: core/symbolic.py's exact division); N, H, W and the kernel stay dynamic."""
    def f(x, w):
        return tc.conv2d(x, w, None, 1, 1, 1, 2)
    fn = tc.trace(f, dynamic=True)
    for size in SIZES:
        x, w = _inputs(8, 32, (3, 3), 2, size, seed=7)
        np.testing.assert_allclose(np.asarray(fn(x, w)), np.asarray(f(tc.tensor(x), tc.tensor(w))),
                                   rtol=1e-4, atol=1e-4, err_msg=str(size))
    assert len(fn.signatures) == 1
    _reads_in_place(fn.lower(x, w).cpu_program)


def test_an_exported_conv_fills_its_tables_in_the_entry_points_temps(tmp_path):
    """tc.export with a run-time N, H, W: the library's entry point sizes the offset tables
    (temps of the program) from the call's sizes; tc.load'ed, it matches eager."""
    x, w = _inputs(6, 16, (3, 3), 1, SIZES[0], seed=8)

    def fn(x):
        return tc.conv2d(x, tc.tensor(w), None, (2, 1), 1)
    _reads_in_place(tc.trace(fn, dynamic=NHW).lower(x).cpu_program)
    path = str(tmp_path / "libconv.so")
    tc.export(fn, [x], path, dynamic=NHW)
    lib = tc.load(path)
    for size in SIZES:
        x, _ = _inputs(6, 16, (3, 3), 1, size, seed=9)
        got = lib(x)            # (one output: returned as it is)
        np.testing.assert_allclose(np.asarray(got), np.asarray(fn(tc.tensor(x))), rtol=1e-4, atol=1e-4, err_msg=str(size))
