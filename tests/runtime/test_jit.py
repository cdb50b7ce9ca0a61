"""The host target and the LLJIT engine: compile, call, free; bounded memory over thousands
of compiles; errors (bad IR, missing symbols, unknown exports) as BackendErrors; system
libraries (libm, libgomp); assembly output."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import weakref

import llvmlite.binding as llvm
import numpy as np
import pytest

from tracecomp.core.errors import BackendError
from tracecomp.runtime import jit
from tracecomp.lower.llvm import target

ADD = """
define i64 @add_k(i64 %x) {{
  %y = add i64 %x, {k}
  ret i64 %y
}}
"""

SAXPY = """
define void @saxpy(ptr noalias %x, ptr noalias %y, float %a, i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %py = getelementptr inbounds float, ptr %y, i64 %i
  %vx = load float, ptr %px, align 4
  %vy = load float, ptr %py, align 4
  %m = fmul float %vx, %a
  %s = fadd float %m, %vy
  store float %s, ptr %py, align 4
  %i1 = add nuw nsw i64 %i, 1
  %done = icmp eq i64 %i1, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def add_k(lib: jit.JitLibrary):
    return lib.function("add_k", ctypes.c_int64, ctypes.c_int64)


def test_host_target_describes_this_process():
    host = target.host_target()
    assert host.triple == llvm.get_process_triple()
    from tracecomp.lower.hostcpu import NARROWER_TARGETS, target_name
    assert host.cpu and host.cpu == (NARROWER_TARGETS[target_name()].cpu or llvm.get_host_cpu_name())
    assert all(f[0] in "+-" for f in host.features.split(","))
    assert target.host_target_machine(3) is target.host_target_machine(3)
    assert target.host_target_machine(3).triple == host.triple


def test_compile_call_and_free():
    lib = jit.compile_module(ADD.format(k=41))
    assert lib.symbols == ("add_k",)
    fn = add_k(lib)
    assert fn(1) == 42
    alive = weakref.ref(lib)
    del lib
    gc.collect()
    assert alive() is not None and fn(2) == 43        # the ctypes function keeps it alive
    del fn
    gc.collect()
    assert alive() is None                             # and with it gone, the code is freed


def test_every_library_is_independent():
    libs = [jit.compile_module(ADD.format(k=k)) for k in range(5)]   # same symbol, 5 libraries
    assert [add_k(lib)(0) for lib in libs] == [0, 1, 2, 3, 4]
    assert len({lib.name for lib in libs}) == 5


def test_libraries_outlive_the_lljit_that_linked_them():
    engine = jit.JitEngine(libraries_per_jit=3)      # a fresh LLJIT every third library
    libs = [engine.compile(ADD.format(k=k)) for k in range(10)]
    assert len({id(lib._lljit) for lib in libs}) == 4
    gc.collect()
    assert [add_k(lib)(100) for lib in libs] == list(range(100, 110))


def test_thousands_of_compiles_do_not_grow_memory_without_bound():
    """3000 modules compiled, called and dropped.  Measured here: a few MiB (llvmlite
    keeps ~2 KiB per optimized module).  Without the engine's fixes it grows ~190 MiB
    (llvmlite leaks each pass pipeline, ~32 KiB, and each emptied JITDylib, ~9 KiB)."""
    engine = jit.JitEngine()
    def compile_call_drop(k):
        lib = engine.compile(ADD.format(k=k))
        assert add_k(lib)(1) == k + 1
    for k in range(300):          # warm up: caches, allocator arenas, the first LLJITs
        compile_call_drop(k)
    gc.collect()
    before = rss_bytes()
    for k in range(3000):
        compile_call_drop(k)
    gc.collect()
    growth = rss_bytes() - before
    assert growth < 24 << 20, f"RSS grew {growth / 2**20:.1f} MiB over 3000 compiles"


def test_missing_symbol_is_a_backend_error():
    src = """
declare i64 @tracecomp_no_such_function(i64)
define i64 @f(i64 %x) {
  %y = call i64 @tracecomp_no_such_function(i64 %x)
  ret i64 %y
}
"""
    with pytest.raises(BackendError, match="tracecomp_no_such_function"):
        jit.compile_module(src)
    # Past the check, at link time: still an error, not a crash.
    module = target.parse(src)
    obj = target.emit_object(module, target.host_target_machine())
    with pytest.raises(BackendError, match="JIT linking"):
        jit.default_engine().add_object(obj, ["f"])


def test_malformed_ir_is_a_backend_error():
    with pytest.raises(BackendError, match="LLVM rejected module"):
        jit.compile_module("define i64 @f(i64 %x) { ret i32 %x }")


def test_unknown_export_is_a_backend_error():
    lib = jit.compile_module(ADD.format(k=1))
    with pytest.raises(BackendError, match="exports no symbol 'nope'"):
        lib.address("nope")


def test_system_libraries():
    assert "libm" in jit.load_system_library("m")
    with pytest.raises(BackendError, match="libtracecomp_no_such_lib is not installed"):
        jit.load_system_library("tracecomp_no_such_lib")


@pytest.mark.skipif(ctypes.util.find_library("gomp") is None, reason="libgomp is not installed")
def test_openmp_symbols_resolve_from_libgomp():
    lib = jit.compile_module("""
declare i32 @omp_get_max_threads()
define i32 @threads() {
  %n = call i32 @omp_get_max_threads()
  ret i32 %n
}
""")
    assert lib.function("threads", ctypes.c_int32)() >= 1


def test_functions_libm_provides():
    lib = jit.compile_module("""
declare double @erf(double)
define double @f(double %x) {
  %y = call double @erf(double %x)
  ret double %y
}
""")
    assert abs(lib.function("f", ctypes.c_double, ctypes.c_double)(0.5) - 0.5204998778130465) < 1e-15


def test_assembly_and_optimized_ir():
    tm = target.host_target_machine()
    module = target.optimize(target.parse(SAXPY), tm)
    assert "<" in str(module) and "x float>" in str(module)          # vectorized
    asm = target.emit_assembly(module, tm)
    assert "saxpy:" in asm and "ret" in asm
    if "+avx512f" in target.host_target().features:
        assert "zmm" in asm or "ymm" in asm
    lib = jit.compile_module(SAXPY)
    x, y = np.arange(100, dtype=np.float32), np.ones(100, np.float32)
    lib.function("saxpy", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_int64)(
        x.ctypes.data, y.ctypes.data, 2.0, 100)
    assert (y == 2 * np.arange(100) + 1).all()


def test_libgomp_idle_threads_spin_briefly_and_the_environment_is_left_alone():
    """libgomp loads with GOMP_SPINCOUNT=10000 (runtime/jit.py: spinning workers starve a
    shared machine), read back with omp_display_env; the variable is gone afterwards, and
    a user's own setting wins."""
    import subprocess
    import sys
    code = ("import ctypes, os, numpy as np, tracecomp as tc\n"
            "from tracecomp.runtime import jit\n"
            "tc.trace(lambda x: (x * 2).sum(1))(np.ones((4096, 1024), np.float32))\n"
            "print('left in environ:', os.environ.get('GOMP_SPINCOUNT'), flush=True)\n"
            "ctypes.CDLL(jit.load_system_library('gomp')).omp_display_env(1)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "left in environ: None" in out.stdout, out.stderr
    assert "GOMP_SPINCOUNT = '10000'" in out.stderr
    out = subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "123"},
                         capture_output=True, text=True, timeout=120)
    assert "left in environ: 123" in out.stdout and "GOMP_SPINCOUNT = '123'" in out.stderr


def test_an_avx2_target_on_a_wider_host_gives_the_same_results(tmp_path):
    """TRACECOMP_TARGET=avx2 (hostcpu.py) turns AVX-512 and AMX off: the matmul's tiles are
    AVX2's, the generated code uses no zmm register and computes what the host's code
    computes (a float64 product with partial tiles exactly as NumPy's, to 1e-12); so does
    the code LLVM generates for Intel's rocketlake, on an AVX-512 host."""
    import subprocess
    import sys
    if "+avx2" not in target.host_target().features.split(","):
        pytest.skip("the host has no AVX2")
    code = ("import sys, numpy as np, tracecomp as tc\n"
            "rng = np.random.default_rng(0)\n"
            "x = rng.standard_normal((64, 200)).astype(np.float32)\n"
            "w = rng.standard_normal((200, 48)).astype(np.float32)\n"
            "img = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)\n"
            "k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)\n"
            "a, b = rng.standard_normal((67, 300)), rng.standard_normal((300, 53))\n"
            "f = tc.trace(lambda x, w, img, k, a, b: (tc.softmax(x @ w, 1), tc.sigmoid(x) * tc.exp(-x * x),\n"
            "                                   tc.nn.functional.conv2d(img, k, padding=1).relu(), a @ b))\n"
            "outs = [np.asarray(o) for o in f(x, w, img, k, a, b)]\n"
            "np.testing.assert_allclose(outs[-1], a @ b, rtol=1e-12, atol=1e-12)\n"
            "np.savez(sys.argv[1], *outs)\n"
            "from tracecomp.lower.schedule.tiles import host_tiles\n"
            "print('zmm' in f.lower(x, w, img, k, a, b).as_text('asm'),\n"
            "      [(t.lanes, t.mr, t.nr) for t in host_tiles().values()])\n")
    results = {}
    names = ("host", "avx2", "rocketlake") if target.host_target().has("avx512bw") else ("host", "avx2")
    for name in names:
        env = {**os.environ, "TRACECOMP_TARGET": name, "TRACECOMP_CACHE_DIR": str(tmp_path / "cache")}
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"{name}.npz")], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        results[name] = (out.stdout.strip(), np.load(tmp_path / f"{name}.npz"))
    # no 512-bit registers, and the tiles of 256-bit vectors in 16 registers (f32, f64)
    assert results["avx2"][0] == "False [(8, 6, 16), (4, 6, 8)]"
    # The float32 product's depth (200) is split into blocks by the tiles' kc, which follows
    # the vector width and the L1d (a 32 KiB L1d gives 160 with 512-bit tiles, 320 with
    # 256-bit ones): another order of the same sums, a few float32 ulps of the logits apart.
    for name in names[1:]:
        for key in results["host"][1].files:
            np.testing.assert_allclose(results[name][1][key], results["host"][1][key], rtol=1e-4, atol=1e-6)
    bad = subprocess.run([sys.executable, "-c", "import tracecomp.lower.llvm.target as t; t.host_target()"],
                         env={**os.environ, "TRACECOMP_TARGET": "sse"}, capture_output=True, text=True, timeout=60)
    assert "TRACECOMP_TARGET='sse' is not a target tracecomp knows (one of host, avx2, rocketlake)" in bad.stderr


def test_a_module_llvm_rejects_raises_and_is_freed_with_its_context():
    """A module that fails verification is closed before its scratch context is freed:
    collecting it afterwards used to dispose it into freed memory (a segfault)."""
    import gc
    import subprocess
    import sys
    code = ("import gc\n"
            "from tracecomp.runtime import jit\n"
            "from tracecomp.core.errors import BackendError\n"
            "ir = ('define void @f() {\\nentry:\\n  br label %b\\na:\\n  %x = add i64 1, 2\\n  ret void\\n'\n"
            "      'b:\\n  %y = add i64 %x, 1\\n  ret void\\n}\\n')\n"
            "for _ in range(3):\n"
            "    try:\n"
            "        jit.default_engine().compile_object(ir)\n"
            "        raise SystemExit('accepted')\n"
            "    except BackendError as e:\n"
            "        assert 'dominate' in str(e), e\n"
            "    gc.collect()\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    gc.collect()
