"""tc.export(..., dynamic=...): one library for every batch size (issue 5).

Every library here is compared, at several sizes, with tracecomp's own static trace of the
same function at that size (itself tested against NumPy elsewhere)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt
from tracecomp.lower.loops.ir import Matmul
from tracecomp.core.symbolic import DynamicShapeError

from test_export import ALLOWED_NEEDED, flat, needed

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="tc.export links with the system C compiler; 'cc' is missing")

CC = os.environ.get("CC", "cc")
SIZES = (1, 2, 31, 257)


def mlp(w1, b1, w2, b2, x):
    h = (x @ w1 + b1).relu()
    return tc.softmax(h @ w2 + b2, -1)


def loss(w1, b1, w2, b2, x, y):
    """A classifier's training loss: the batch size enters through log_softmax's rows,
    the mean over the batch and x.shape[0]."""
    h = (x @ w1 + b1).tanh()
    logits = h @ w2 + b2
    return -(tc.log_softmax(logits, -1) * y).sum() / x.shape[0] + 0.01 * (logits ** 2).mean()


def weights(rng):
    return [rng.standard_normal(s).astype(np.float32) * 0.3 for s in [(12, 16), (16,), (16, 5), (5,)]]


def batch(rng, n):
    x = rng.standard_normal((n, 12)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[rng.integers(0, 5, n)]
    return x, y


def assert_same(got, want):
    for g, w in zip(flat(got), flat(want)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, equal_nan=True)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("dynamic")
    w = weights(rng)
    x, y = batch(rng, 8)
    step = tc.value_and_grad(loss, argnums=(0, 1, 2, 3))
    forward = str(folder / "libforward.so")
    train = str(folder / "libtrain.so")
    md_forward = tc.export(mlp, w + [x], forward, dynamic={"x": {0: "batch"}})
    md_train = tc.export(step, w + [x, y], train, dynamic={"x": {0: "batch"}, "y": {0: "batch"}})
    return {"w": w, "forward": (forward, md_forward), "train": (train, md_train), "step": step}


def test_metadata_and_header_name_the_dynamic_size(libs):
    path, md = libs["train"]
    assert md["sizes"] == ["batch"]
    assert md["dynamic"] == [{"name": "batch", "input": 4, "axis": 0}, {"name": "batch", "input": 5, "axis": 0}]
    assert md["inputs"][4]["shape"] == ["batch", 12] and md["outputs"][0]["shape"] == []
    header = open(path[:-3] + ".h").read()
    assert "int train(const void* const* inputs, void* const* outputs, int64_t batch);" in header
    assert "inputs[4]: float32[batch, 12]  -> float[batch*12], batch*12*4 bytes" in header
    assert needed(path) <= ALLOWED_NEEDED


@pytest.mark.parametrize("n", SIZES)
def test_one_forward_library_serves_every_batch_size(libs, n):
    rng = np.random.default_rng(n)
    x, _ = batch(rng, n)
    got = tc.load(libs["forward"][0])(*libs["w"], x)
    assert got.shape == (n, 5)
    assert_same(got, tc.trace(mlp)(*libs["w"], x))


@pytest.mark.parametrize("n", SIZES)
def test_one_training_step_library_serves_every_batch_size(libs, n):
    rng = np.random.default_rng(100 + n)
    x, y = batch(rng, n)
    assert_same(tc.load(libs["train"][0])(*libs["w"], x, y), tc.trace(libs["step"])(*libs["w"], x, y))


def test_load_checks_dynamic_shapes(libs):
    f = tc.load(libs["train"][0])
    rng = np.random.default_rng(1)
    x, y = batch(rng, 4)
    with pytest.raises(tc.ArgumentError, match=r"input 5 must be float32\[batch, 5\], got float32\[3, 5\]; batch = 4"):
        f(*libs["w"], x, y[:3])
    with pytest.raises(tc.ArgumentError, match=r"input 4 must be float32\[batch, 12\], got float32\[0, 12\]"):
        f(*libs["w"], x[:0], y[:0])


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "libtrain.h"

/* inputs for one batch size, read from a file: the buffers back to back */
static void read_inputs(const char* path, const void** inputs, const size_t* bytes) {
    FILE* f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    for (int i = 0; i < TRAIN_NUM_INPUTS; i++) {
        void* p = malloc(bytes[i]);
        if (fread(p, 1, bytes[i], f) != bytes[i]) { fprintf(stderr, "short read\n"); exit(2); }
        inputs[i] = p;
    }
    fclose(f);
}

int main(int argc, char** argv) {
    for (int run = 1; run + 1 < argc; run += 2) {
        int64_t batch = atoll(argv[run]);
        size_t in_bytes[] = {%(in_bytes)s};
        size_t out_bytes[] = {%(out_bytes)s};
        const void* inputs[TRAIN_NUM_INPUTS];
        void* outputs[TRAIN_NUM_OUTPUTS];
        read_inputs(argv[run + 1], inputs, in_bytes);
        for (int j = 0; j < TRAIN_NUM_OUTPUTS; j++) outputs[j] = malloc(out_bytes[j] ? out_bytes[j] : 1);
        int code = train(inputs, outputs, batch);
        if (code != 0) { fprintf(stderr, "error %%d: %%s\n", code, train_error_string(code)); return 1; }
        printf("batch %%lld\n", (long long)batch);
        for (int j = 0; j < TRAIN_NUM_OUTPUTS; j++) {
            const float* o = outputs[j];
            printf("out%%d", j);
            for (size_t k = 0; k < out_bytes[j] / sizeof(float); k++) printf(" %%.9g", o[k]);
            printf("\n");
        }
        /* the checked entry point reads the batch size from the input shapes */
%(shape_decls)s
        printf("checked %%d\n", train_checked(inputs, in_shapes, outputs, out_shapes));
        in_shape_5[0] = batch + 1;           /* y claims another batch size than x */
        code = train_checked(inputs, in_shapes, outputs, out_shapes);
        printf("checked_bad %%d %%s\n", code, train_error_string(code));
        printf("size0 %%d %%s\n", train(inputs, outputs, 0), train_error_string(2));
    }
    return 0;
}
"""


def c_dim(d) -> str:
    return f"({d})"


def test_c_program_runs_one_library_at_two_batch_sizes(libs, tmp_path):
    """The issue's test: a C program compiled against the header calls the library at two
    batch sizes; its outputs match tracecomp's in Python."""
    path, md = libs["train"]

    def nbytes(d):
        return "(size_t)(" + "*".join([c_dim(x) for x in d["shape"]] + ["4"]) + ")"

    decls = []
    for kind, items in (("in", md["inputs"]), ("out", md["outputs"])):
        for d in items:
            dims = ", ".join(c_dim(x) for x in d["shape"]) or "0"
            decls.append(f"        int64_t {kind}_shape_{d['index']}[] = {{{dims}}};")
        decls.append(f"        const int64_t* {kind}_shapes[] = {{"
                     + ", ".join(f"{kind}_shape_{d['index']}" for d in items) + "};")
    src = tmp_path / "main.c"
    src.write_text(C_PROGRAM % {"in_bytes": ", ".join(nbytes(d) for d in md["inputs"]),
                                "out_bytes": ", ".join(nbytes(d) for d in md["outputs"]),
                                "shape_decls": "\n".join(decls)})
    libdir = os.path.dirname(path)
    exe = tmp_path / "main"
    subprocess.run([CC, "-std=c99", "-Wall", "-Werror", str(src), "-I", libdir, "-L", libdir, "-ltrain",
                    f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True, capture_output=True, text=True)
    args, wants = [], {}
    for n in (3, 50):
        x, y = batch(np.random.default_rng(n), n)
        data = tmp_path / f"in{n}.bin"
        data.write_bytes(b"".join(np.ascontiguousarray(a).tobytes() for a in libs["w"] + [x, y]))
        args += [str(n), str(data)]
        wants[n] = flat(tc.trace(libs["step"])(*libs["w"], x, y))
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    blocks = run.stdout.split("batch ")[1:]
    assert [int(b.split("\n", 1)[0]) for b in blocks] == [3, 50]
    for block in blocks:
        n = int(block.split("\n", 1)[0])
        lines = dict(line.split(" ", 1) for line in block.strip().splitlines()[1:])
        for i, want in enumerate(wants[n]):
            got = np.array(lines[f"out{i}"].split(), np.float32).reshape(want.shape)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
        assert lines["checked"] == "0"
        assert lines["checked_bad"].startswith("1005 input 5 must have shape [batch, 5]")
        assert lines["size0"] == "2 a dynamic size argument is less than 1"


@pytest.mark.parametrize("fn", [
    lambda x: (x.reshape(-1) * 2.0).sum(),                  # flatten: batch*12
    lambda x: x.reshape(x.shape[0], 3, 4).sum(1),           # split the inner dim
    lambda x: x.mean(0) + x.mean(),                         # means over the batch
    lambda x: x.T @ x,                                      # the batch as matmul K
    lambda x: (x - x.mean(1, keepdim=True)) / (x.var(1, keepdim=True) + 1e-5).sqrt(),
    lambda x: x.sum(1, keepdim=True).expand(x.shape[0], 12) * x,
    lambda x: tc.zeros(x.shape) + x.amax(0) - x.argmax(1, keepdim=True).float(),
    lambda x: tc.cat([x, x * 2.0], 0).sum(0),              # 2*batch rows
], ids=["flatten", "reshape", "mean", "xTx", "layernorm", "expand", "zeros_amax_argmax", "cat"])
def test_dynamic_size_flows_through_views_reductions_and_matmuls(fn, tmp_path):
    rng = np.random.default_rng(7)
    path = str(tmp_path / "libf.so")
    tc.export(fn, [rng.standard_normal((6, 12)).astype(np.float32)], path, dynamic={0: {0: "n"}})
    f = tc.load(path)
    for n in (1, 5, 40):
        x = rng.standard_normal((n, 12)).astype(np.float32)
        assert_same(f(x), tc.trace(fn)(x))


@pytest.mark.parametrize("fn, dims", [
    (lambda x, w: (x @ w).relu() + 1.0, "m"),                   # the batch as rows, epilogue fused
    (lambda x, w: x.T @ (x @ w), "k"),                           # ... as the depth
    (lambda x, w: w.T @ x.T, "n"),                               # ... as the columns
], ids=["m", "k", "n"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_matmuls_take_run_time_sizes(fn, dims, dtype, tmp_path):
    """The packed matmul kernel with a run-time m, n or k: sizes around its register tiles
    (8 x 32 / 8 x 16), its blocks and its thread split."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 72)).astype(dtype)
    path = str(tmp_path / "libmm.so")
    example = [rng.standard_normal((64, 40)).astype(dtype), w]
    program = tc.trace(fn).lower_dynamic(tuple(example), {"x": {0: "n"}}).program
    assert all(s.workspace is not None for k in program.kernels for s in k.body if isinstance(s, Matmul))
    tc.export(fn, example, path, dynamic={"x": {0: "n"}})
    f = tc.load(path)
    for n in (1, 7, 9, 33, 300, 1000):
        x = rng.standard_normal((n, 40)).astype(dtype)
        got, want = f(x, w).numpy(), fn(tc.tensor(x), tc.tensor(w)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == np.float32 else 1e-10,
                                   atol=1e-3 if dtype == np.float32 else 1e-9, err_msg=f"n={n}")


@pytest.mark.parametrize("fn, message", [
    (lambda x: x.reshape(5, -1), r"reshape: the remainder of the dynamic size 12\*batch divided by 5"),
    (lambda x: x[:4], "slice: cannot decide whether batch < 4"),
    (lambda x: x[1], "select: cannot decide whether batch > 1"),
    (lambda x: x * 2.0 if x.shape[0] > 4 else x, "cannot decide whether batch > 4"),
    (lambda x: x + np.ones((5, 12), np.float32), "shapes cannot broadcast.*batch in 'self' but 5 in 'other'"),
], ids=["reshape", "slice", "select", "python_if", "broadcast"])
def test_shapes_the_size_cannot_flow_through_are_refused_at_export(fn, message, tmp_path):
    x = np.ones((8, 12), np.float32)
    with pytest.raises(tc.ShapeError, match=message) as info:
        tc.export(fn, [x], str(tmp_path / "libbad.so"), dynamic={"x": {0: "batch"}})
    assert "test_export_dynamic.py" in str(info.value)          # the user's line
    assert not os.path.exists(tmp_path / "libbad.so")


@pytest.mark.parametrize("dynamic, message", [
    ({"z": {0: "batch"}}, "'z' is not an argument of mlp"),
    ({"x": {2: "batch"}}, "axis 2 is not one of its dims"),
    ({"x": {0: "my batch"}}, "must be an identifier"),
    ({"x": [0]}, "needs a dict of"),
    ({"x": {0: "inputs"}}, "taken by the entry point"),
])
def test_bad_dynamic_specs(dynamic, message, tmp_path, libs):
    x = np.ones((8, 12), np.float32)
    with pytest.raises(tc.ArgumentError, match=message):
        tc.export(mlp, libs["w"] + [x], str(tmp_path / "libbad.so"), dynamic=dynamic)


@pytest.mark.skipif(find_mlir_opt() is None, reason="mlir-opt is not installed")
def test_dynamic_loops_are_valid_mlir(libs):
    x, y = batch(np.random.default_rng(0), 8)
    lowered = tc.trace(libs["step"]).lower_dynamic((*libs["w"], x, y), {"x": {0: "batch"}, "y": {0: "batch"}})
    text = lowered.as_text("loops")
    assert "%size_batch: index" in text and "memref<?x12xf32>" in text
    check_with_mlir_opt(text, "loops.mlir")
    check_with_mlir_opt(lowered.as_text("optimized"), "graph.mlir")


def test_dynamic_error_type_is_a_shape_error():
    assert issubclass(DynamicShapeError, tc.ShapeError)


# ------------------------------------------------------------------- random programs

from hypothesis import given, settings, strategies as st  # noqa: E402

from test_random_programs import PROFILE, Builder, _as_list, _compare, _input_array  # noqa: E402


@settings(**{**PROFILE, "max_examples": 40})
@given(st.data())
def test_random_programs_exported_with_a_dynamic_first_dim(tmp_path_factory, data):
    """hypothesis' random programs (test_random_programs.py) with the first dim of their
    full-rank inputs made dynamic: where the export accepts that, the library at two other
    sizes matches tracecomp's static trace at those sizes."""
    p = Builder(data).program(max_steps=6)
    initial = next(k for k, m in enumerate(p.makes) if not isinstance(m, int))
    first = p.inputs[0].shape
    if not first or first[0] < 2:
        return                          # a dim of 1 broadcasts: not the same program dynamic
    dynamic = {k: {0: "n"} for k, a in enumerate(p.inputs[:initial]) if a.shape == first}

    def fn(*xs):
        return p(*xs)
    path = str(tmp_path_factory.mktemp("random") / "librandom.so")
    try:
        tc.export(fn, p.inputs, path, dynamic=dynamic)
    except tc.ShapeError:
        return                          # the program needs the size's value (a view, a select)
    f = tc.load(path)
    for n in (1, first[0] + 3):
        inputs = [_input_array(data, (n,) + a.shape[1:], str(a.dtype)) if k in dynamic else a
                  for k, a in enumerate(p.inputs)]
        want = _as_list(tc.trace(fn)(*inputs))
        _compare(_as_list(f(*inputs)), want, [p.vals[i] for i in p.outputs], f"output at n={n}")


def test_a_dynamic_trace_runs_in_the_jit_at_every_size(libs):
    """The trace export compiles also runs in this process (tc.trace(dynamic=...)'s program)."""
    x, _ = batch(np.random.default_rng(0), 4)
    lowered = tc.trace(mlp).lower_dynamic((*libs["w"], x), {"x": {0: "batch"}})
    for n in (1, 3, 40):
        x, _ = batch(np.random.default_rng(n), n)
        assert_same(lowered.run([*libs["w"], x]), tc.trace(mlp, dynamic=False)(*libs["w"], x))
    with pytest.raises(tc.ArgumentError, match=r"input 4 axis 1 must be 12, got 3"):
        lowered.run([*libs["w"], x[:, :3]])


CHILD_HUGE_SIZE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
entry = getattr(lib, sys.argv[2])
entry.restype = ctypes.c_int
entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
buf = ctypes.create_string_buffer(1 << 16)
ptrs = (ctypes.c_void_p * 8)(*([ctypes.addressof(buf)] * 8))
for size in (1 << 62, (1 << 61) + 1, 1 << 55):
    code = entry(ptrs, ptrs, size)
    lib_error = getattr(lib, sys.argv[2] + "_error_string")
    lib_error.restype = ctypes.c_char_p
    print(size, code, lib_error(code).decode())
"""


def test_a_size_whose_buffers_would_overflow_int64_returns_an_error(tmp_path):
    """`step(in, out, 1 << 62)`: the workspace's byte count wrapped around and the call wrote
    far outside a small block (a segfault); now it returns error 4 before touching memory."""
    def fn(x):
        return (x.exp() * 2.0).sum(1) + x.sum(1)         # temps of batch x 784 floats
    path = str(tmp_path / "libhuge.so")
    tc.export(fn, [np.ones((3, 784), np.float32)], path, dynamic={"x": {0: "batch"}})
    run = subprocess.run([sys.executable, "-c", CHILD_HUGE_SIZE, path, "huge"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for line in run.stdout.strip().splitlines():
        size, code, message = line.split(" ", 2)
        assert code == "4", line
        assert "larger than 2^62 bytes" in message


def test_a_transformer_exports_with_a_dynamic_sequence_length(tmp_path):
    """Issue 36's model: positions from tc.arange(ids.shape[1]) and causal attention, with the
    sequence length a run-time size (each raised a DynamicShapeError or a bare ValueError)."""
    from tracecomp.demo.gpt import GPT
    tc.manual_seed(0)
    model = GPT(64, 32, 32, 4, 2)
    model.eval()

    def forward(ids):
        return model(ids)
    rng = np.random.default_rng(0)
    path = str(tmp_path / "libgpt.so")
    tc.export(forward, [rng.integers(0, 64, (2, 8))], path, dynamic={"ids": {1: "seq"}})
    f = tc.load(path)
    for t in (1, 3, 17, 32):
        ids = rng.integers(0, 64, (2, t))
        np.testing.assert_allclose(f(ids).numpy(), tc.trace(forward)(ids).numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=f"seq={t}")


@pytest.mark.parametrize("fn", [lambda x: tc.arange(0, -x.shape[1], -1) + x,
                                lambda x: tc.arange(2, x.shape[1] + 2).to(tc.float32) * x],
                         ids=["descending", "offset"])
def test_arange_of_a_dynamic_size(fn, tmp_path):
    path = str(tmp_path / "libarange.so")
    tc.export(fn, [np.ones((2, 5), np.float32)], path, dynamic={"x": {1: "n"}})
    f = tc.load(path)
    for n in (1, 4, 9):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), fn(tc.tensor(x)).numpy(), rtol=1e-6)


def test_arange_with_a_dynamic_bound_needs_a_unit_step(tmp_path):
    with pytest.raises(DynamicShapeError, match=r"arange.*the step must be the integer 1 or -1 \(got 2\)"):
        tc.export(lambda x: tc.arange(0, x.shape[1], 2).to(tc.float32).sum() + x, [np.ones((2, 5), np.float32)],
                  str(tmp_path / "libbad.so"), dynamic={"x": {1: "n"}})
