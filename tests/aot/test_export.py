"""tc.export / tc.load: ahead-of-time shared libraries with a C header (issue 5, static shapes)."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.tensors import pytree
from tracecomp.aot import loader

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="tc.export links with the system C compiler; 'cc' is missing")

ALLOWED_NEEDED = {"libc.so.6", "libm.so.6", "libgomp.so.1"}


def small_fn(x, w, idx):
    h = (x @ w).relu()
    return h.sum(dim=1) * 2.0, tc.index_select(x, 0, idx), x.sum()


def mlp_loss(w1, b1, w2, b2, x, y):
    h = (x @ w1 + b1).tanh()
    logits = h @ w2 + b2
    return ((logits - y) ** 2).mean()


def small_inputs(rng):
    return [tc.tensor(rng.standard_normal((4, 8)).astype(np.float32)),
            tc.tensor(rng.standard_normal((8, 3)).astype(np.float32)),
            tc.tensor(np.array([3, 0, 2, 2, 1], dtype=np.int64))]


def mlp_inputs(rng):
    shapes = [(8, 16), (16,), (16, 4), (4,), (32, 8), (32, 4)]
    return [tc.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def flat(result):
    leaves, _ = pytree.flatten(result, lambda x: isinstance(x, tc.Tensor))
    return [t.numpy() for t in leaves]


def needed(path: str) -> set[str]:
    """DT_NEEDED entries of an ELF shared object, parsed with Python (no readelf needed)."""
    import struct
    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = [s for s in sections if s[1] == 6]          # SHT_DYNAMIC
    assert len(dynamic) == 1
    _, _, _, _, off, size, link, _, _, entsize = dynamic[0]
    strtab = sections[link]
    names = set()
    for i in range(size // entsize):
        tag, val = struct.unpack_from("<qQ", data, off + i * entsize)
        if tag == 1:                                       # DT_NEEDED
            start = strtab[4] + val
            names.add(data[start:data.index(b"\0", start)].decode())
    return names


@pytest.fixture(scope="module")
def small_lib(tmp_path_factory):
    rng = np.random.default_rng(0)
    inputs = small_inputs(rng)
    path = str(tmp_path_factory.mktemp("small") / "libsmall.so")
    metadata = tc.export(small_fn, inputs, path)
    return path, inputs, metadata


@pytest.fixture(scope="module")
def mlp_lib(tmp_path_factory):
    rng = np.random.default_rng(1)
    inputs = mlp_inputs(rng)
    path = str(tmp_path_factory.mktemp("mlp") / "libtrain_step.so")
    tc.export(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3)), inputs, path)
    return path, inputs


def test_export_writes_library_header_and_metadata(small_lib):
    path, _, metadata = small_lib
    assert os.path.exists(path) and os.path.exists(path[:-3] + ".h")
    header = open(path[:-3] + ".h").read()
    for decl in ("int small(const void* const* inputs, void* const* outputs);",
                 "const char* small_error_string(int code);", "const char* small_metadata(void);"):
        assert decl in header
    assert metadata["tracecomp_version"] == tc.__version__
    assert [d["shape"] for d in metadata["inputs"]] == [[4, 8], [8, 3], [5]]
    assert [d["dtype"] for d in metadata["inputs"]] == ["float32", "float32", "int64"]
    assert metadata["target"]["features"] and metadata["target"]["cpu"]
    lib = ctypes.CDLL(path)
    lib.small_metadata.restype = ctypes.c_char_p
    assert json.loads(lib.small_metadata()) == metadata


def test_load_matches_trace(small_lib):
    path, inputs, _ = small_lib
    f = tc.load(path)
    got = flat(f(*inputs))
    want = flat(tc.trace(small_fn)(*inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    # NumPy arrays work as inputs too
    np.testing.assert_allclose(f(*[t.numpy() for t in inputs])[0].numpy(), want[0], rtol=1e-6)


def test_load_checks_inputs(small_lib):
    path, inputs, _ = small_lib
    f = tc.load(path)
    with pytest.raises(tc.ArgumentError, match=r"input 0 must be float32\[4, 8\], got float32\[5, 8\]"):
        f(tc.tensor(np.zeros((5, 8), np.float32)), inputs[1], inputs[2])
    with pytest.raises(tc.ArgumentError, match=r"input 1 must be float32\[8, 3\], got float64"):
        f(inputs[0], np.zeros((8, 3)), inputs[2])
    with pytest.raises(tc.ArgumentError, match="takes 3 inputs, got 2"):
        f(inputs[0], inputs[1])
    for bad in (4, -1):
        idx = np.array([0, 1, bad, 2, 3], np.int64)
        with pytest.raises(tc.ArgumentError, match=r"error 16: input 2 \(int64\[5\]\): an index is out "
                                                   r"of bounds for dim 0 with size 4 \(index_select\)"):
            f(inputs[0], inputs[1], idx)


def test_exported_index_check_allows_an_ignore_index(tmp_path):
    path = str(tmp_path / "libce.so")
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    tc.export(lambda x, t: tc.cross_entropy(x, t), [x, np.array([0, 1, 2])], path)
    f = tc.load(path)
    want = tc.cross_entropy(tc.tensor(x), tc.tensor([0, -100, 3]))
    np.testing.assert_allclose(f(x, np.array([0, -100, 3])).numpy(), want.numpy(), rtol=1e-6)
    with pytest.raises(tc.ArgumentError, match=r"an index is out of bounds for dim 1 with size 4"):
        f(x, np.array([0, 4, 3]))


def test_exported_index_check_allows_negative_indices_that_count_from_the_end(tmp_path):
    """x[i] wraps negative i, so the library accepts [-size, size) and refuses the rest."""
    path = str(tmp_path / "libtake.so")
    x = np.arange(4, dtype=np.float32)
    tc.export(lambda x, i: x[i], [x, np.array([0, 1])], path)
    f = tc.load(path)
    np.testing.assert_array_equal(f(x, np.array([-4, 3])).numpy(), [0, 3])
    for bad in ([4, 0], [-5, 0]):
        with pytest.raises(tc.ArgumentError, match=r"an index is out of bounds for dim 0 with size 4"):
            f(x, np.array(bad))


def test_exported_mlp_training_step_matches_trace(mlp_lib):
    path, inputs = mlp_lib
    result = tc.load(path)(*inputs)
    value, grads = result                     # the structure of value_and_grad: (value, (g0..g3))
    assert isinstance(grads, tuple) and len(grads) == 4 and isinstance(value, tc.Tensor)
    got = flat(result)
    want = flat(tc.trace(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3)))(*inputs))
    assert len(got) == 5
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_library_needs_only_libc_libm_libgomp(small_lib, mlp_lib, tmp_path):
    # a function big enough for parallel loops, so libgomp is really used
    x = tc.tensor(np.random.default_rng(2).standard_normal((256, 512)).astype(np.float32))
    w = tc.tensor(np.random.default_rng(3).standard_normal((512, 256)).astype(np.float32) * 0.01)
    big = str(tmp_path / "libbig.so")
    tc.export(lambda x, w: (x @ w).tanh().sum(dim=1), [x, w], big)
    for path in (small_lib[0], mlp_lib[0], big):
        assert needed(path) <= ALLOWED_NEEDED, needed(path)
    assert "libgomp.so.1" in needed(big)
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", big], capture_output=True, text=True, check=True).stdout
        listed = {line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line}
        assert listed == needed(big)
    got = tc.load(big)(x, w).numpy()
    np.testing.assert_allclose(got, tc.trace(lambda x, w: (x @ w).tanh().sum(dim=1))(x, w).numpy(),
                               rtol=1e-4, atol=1e-4)


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "libtrain_step.h"
%(arrays)s
int main(void) {
    const void* inputs[TRAIN_STEP_NUM_INPUTS] = {%(in_names)s};
%(out_decls)s
    void* outputs[TRAIN_STEP_NUM_OUTPUTS] = {%(out_names)s};
    int code = train_step(inputs, outputs);
    if (code != 0) { fprintf(stderr, "error %%d: %%s\n", code, train_step_error_string(code)); return 1; }
%(prints)s
    /* the shape-checking entry point: right shapes run, a wrong one is an error code */
%(shape_decls)s
    code = train_step_checked(inputs, in_shapes, outputs, out_shapes);
    printf("checked %%d\n", code);
    in_shape_4[0] = 33;      /* inputs[4] claims 33 rows instead of 32 */
    code = train_step_checked(inputs, in_shapes, outputs, out_shapes);
    printf("checked_bad %%d %%s\n", code, train_step_error_string(code));
    in_shape_4[0] = 32;
    out_shape_3[1] = 5;      /* outputs[3] (d loss / d w2, [16, 4]) claims 5 columns */
    code = train_step_checked(inputs, in_shapes, outputs, out_shapes);
    printf("checked_bad_out %%d\n", code);
    /* errors come back as codes, not crashes */
    outputs[1] = NULL;
    code = train_step(inputs, outputs);
    printf("null %%d %%s\n", code, train_step_error_string(code));
    printf("unknown %%s\n", train_step_error_string(12345));
    printf("meta %%s\n", train_step_metadata());
    return 0;
}
"""


def test_c_program_against_header(mlp_lib, tmp_path):
    path, inputs = mlp_lib
    arrays, in_names = [], []
    for i, t in enumerate(inputs):
        vals = ", ".join(f"{v:.9g}f" for v in t.numpy().ravel())
        arrays.append(f"static float in{i}[] = {{{vals}}};")
        in_names.append(f"in{i}")
    md = tc.load(path).metadata
    out_decls, prints, out_names = [], [], []
    for d in md["outputs"]:
        i, n = d["index"], int(np.prod(d["shape"], dtype=np.int64))
        out_decls.append(f"    float* out{i} = malloc({max(n, 1)} * sizeof(float));")
        out_names.append(f"out{i}")
        prints.append(f'    printf("out{i}"); for (int j = 0; j < {n}; j++) printf(" %.9g", out{i}[j]); printf("\\n");')
    decls = []
    for kind, items in (("in", md["inputs"]), ("out", md["outputs"])):
        for d in items:
            dims = ", ".join(str(x) for x in d["shape"]) or "0"
            decls.append(f"    int64_t {kind}_shape_{d['index']}[] = {{{dims}}};")
        names = ", ".join(f"{kind}_shape_{d['index']}" for d in items)
        decls.append(f"    const int64_t* {kind}_shapes[] = {{{names}}};")
    src = tmp_path / "main.c"
    src.write_text(C_PROGRAM % {"arrays": "\n".join(arrays), "in_names": ", ".join(in_names),
                                "out_decls": "\n".join(out_decls), "out_names": ", ".join(out_names),
                                "prints": "\n".join(prints), "shape_decls": "\n".join(decls)})
    libdir = os.path.dirname(path)
    exe = tmp_path / "main"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c99", "-Wall", "-Werror", str(src), "-I", libdir,
                    "-L", libdir, "-ltrain_step", f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] if " " in line else "" for line in run.stdout.splitlines()}
    want = flat(tc.trace(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3)))(*inputs))
    for i, w in enumerate(want):
        got = np.array([float(v) for v in lines[f"out{i}"].split()], np.float32).reshape(w.shape)
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    assert lines["checked"] == "0"
    assert lines["checked_bad"].startswith("1004 input 4 must have shape [32, 8]")
    assert lines["checked_bad_out"] == "2003"
    assert lines["null"].startswith("1 a NULL pointer")
    assert lines["unknown"] == "unknown error code"
    assert json.loads(lines["meta"])["name"] == "train_step"


def test_c_api_bad_index_returns_error_code(small_lib):
    path, inputs, _ = small_lib
    lib = ctypes.CDLL(path)
    lib.small.restype = ctypes.c_int
    lib.small_error_string.restype = ctypes.c_char_p
    arrays = [np.ascontiguousarray(t.numpy()) for t in inputs]
    arrays[2] = np.array([0, 1, 1000000, 2, 3], np.int64)
    outs = [np.empty((4,), np.float32), np.empty((5, 8), np.float32), np.empty((), np.float32)]
    ins = (ctypes.c_void_p * 3)(*[a.ctypes.data for a in arrays])
    ous = (ctypes.c_void_p * 3)(*[o.ctypes.data for o in outs])
    assert lib.small(ins, ous) == 16
    assert b"out of bounds" in lib.small_error_string(16)
    assert lib.small(None, ous) == 1


def test_load_refuses_library_for_missing_cpu_feature(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    inputs = small_inputs(rng)
    from tracecomp.lower.llvm.target import host_target
    path = str(tmp_path / "libfuture.so")
    tc.export(small_fn, inputs, path,
              _metadata_overrides={"target": {"cpu": "future-cpu",
                                              "features": host_target().features + ",+avx1024-imaginary"}})
    with pytest.raises(tc.TracecompError, match=r"compiled for CPU 'future-cpu' and uses features this "
                                                r"host's CPU lacks: avx1024-imaginary"):
        tc.load(path)
    # an honest library on a host that (pretends to) lack one of its features
    honest = str(tmp_path / "libhonest.so")
    tc.export(small_fn, inputs, honest)
    real = loader.host_cpu_features()
    monkeypatch.setattr(loader, "host_cpu_features", lambda: real - {"sse2"})
    with pytest.raises(tc.TracecompError, match="lacks: sse2"):
        tc.load(honest)


def test_export_errors(tmp_path):
    x = tc.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(tc.ArgumentError, match="not a C identifier"):
        tc.export(lambda x: x * 2.0, [x], str(tmp_path / "libd.so"), name="no-good")
    with pytest.raises(tc.ArgumentError, match="no such file"):
        tc.load(str(tmp_path / "libmissing.so"))


def test_output_structure_round_trips(tmp_path):
    x = tc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    path = str(tmp_path / "libtree.so")
    md = tc.export(lambda x: {"double": x * 2.0, "parts": [x.sum(), (x - 1.0, 7)]}, [x], path)
    got = tc.load(path)(x)
    assert set(got) == {"double", "parts"} and got["parts"][1][1] == 7
    np.testing.assert_array_equal(got["parts"][1][0].numpy(), x.numpy() - 1)
    np.testing.assert_array_equal(got["double"].numpy(), x.numpy() * 2)
    header = open(path[:-3] + ".h").read()
    assert "outputs[2]: float32[2, 3]  -> float[6], 24 bytes  = result['parts'][1][0]" in header
    assert md["output_structure"]["dict"][0][0] == "double"


def test_two_libraries_with_same_kernel_names_coexist(tmp_path):
    x = tc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    a, b = str(tmp_path / "liba.so"), str(tmp_path / "libb.so")
    tc.export(lambda x: x * 2.0, [x], a)
    tc.export(lambda x: x * 3.0, [x], b)
    fa, fb = tc.load(a), tc.load(b)
    np.testing.assert_array_equal(fa(x).numpy(), x.numpy() * 2)
    np.testing.assert_array_equal(fb(x).numpy(), x.numpy() * 3)


def test_outputs_that_are_inputs_constants_or_repeats(tmp_path):
    x = tc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    mask = tc.tensor(np.array([True, False, True]))
    s = tc.tensor(np.float64(2.5))

    def f(x, mask, s):
        y = x * 2.0
        return x, y, y, tc.tensor(np.array([1.0, 2.0], np.float32)), mask, x > 1.0, s * 2.0
    path = str(tmp_path / "libedge.so")
    tc.export(f, [x, mask, s], path)
    got = flat(tc.load(path)(x, mask, s))
    want = flat(tc.trace(f)(x, mask, s))
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_entry_name_is_checked_against_kernel_names(tmp_path):
    x = tc.tensor(np.ones((2, 3), np.float32))
    double = lambda x: x * 2.0     # noqa: E731
    kernel = tc.trace(double).lower(x).program.kernels[0].name     # k0_test_export_pyN_mul
    with pytest.raises(tc.ArgumentError, match=f"clashes with the kernel '{kernel}'"):
        tc.export(double, [x], str(tmp_path / "libk.so"), name=kernel)
    for name in ("model", "k0", "tc_k0"):
        tc.export(lambda x: x * 2.0, [x], str(tmp_path / f"lib{name}.so"), name=name)
        np.testing.assert_array_equal(tc.load(str(tmp_path / f"lib{name}.so"), name=name)(x).numpy(),
                                      x.numpy() * 2)


def test_reexport_to_the_same_path_loads_the_new_library(tmp_path):
    x = tc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    path = str(tmp_path / "libagain.so")
    tc.export(lambda x: x * 2.0, [x], path)
    first = tc.load(path)
    tc.export(lambda x: x.sum(dim=0) * 3.0, [x], path)
    second = tc.load(path)
    np.testing.assert_array_equal(second(x).numpy(), x.numpy().sum(axis=0) * 3)
    np.testing.assert_array_equal(first(x).numpy(), x.numpy() * 2)     # the old one still works


FORK_SCRIPT = r"""
import multiprocessing, sys
import numpy as np
import tracecomp as tc
rng = np.random.default_rng(4)
x = rng.standard_normal((256, 512)).astype(np.float32)
w = (rng.standard_normal((512, 256)) * 0.01).astype(np.float32)
f = tc.load(sys.argv[1])                # a fresh process: nothing but tc.load touched libgomp
print("parent", float(f(x, w).numpy().sum()), flush=True)     # the thread pool runs now

def child():
    print("child", float(f(x, w).numpy().sum()), flush=True)

p = multiprocessing.get_context("fork").Process(target=child)
p.start()
p.join(30)
print("hung" if p.is_alive() else "exit %d" % p.exitcode, flush=True)
if p.is_alive():
    p.kill()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_loaded_parallel_library_works_in_a_forked_child(tmp_path):
    """libgomp is not fork-safe; tc.load loads it through the JIT's loader, which makes a
    forked child run one thread (without that, this child hangs)."""
    import sys
    rng = np.random.default_rng(4)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 256)) * 0.01).astype(np.float32)
    path = str(tmp_path / "libpar.so")
    tc.export(lambda x, w: (x @ w).tanh().sum(dim=1), [tc.tensor(x), tc.tensor(w)], path)
    assert "libgomp.so.1" in needed(path)
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    run = subprocess.run([sys.executable, str(script), path], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert lines.get("exit") == "0", run.stdout
    assert float(lines["child"]) == pytest.approx(float(lines["parent"]), rel=1e-5)


def test_random_ops_are_refused_at_export(tmp_path):
    x = tc.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(tc.ArgumentError, match="draw random numbers"):
        tc.export(lambda x: x + tc.rand(2, 3), [x], str(tmp_path / "librand.so"))
    assert not (tmp_path / "librand.so").exists()
