"""The compiled call path (fast signature key, prepared marshalling) keeps every check, and
compile times per stage are reported (Lowered.timings, TRACECOMP_LOG)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core import timings
from tracecomp.runtime.memory import aligned_empty_at, data_pointer


def test_repeated_calls_with_arrays_and_tensors_give_fresh_right_results():
    f = tc.trace(lambda x, y: x * y + 1)
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2, np.float32)
    first = f(x, y)
    for args in [(x, y), (tc.tensor(x), y), (x, tc.tensor(y)), (tc.tensor(x), tc.tensor(y))]:
        out = f(*args)
        np.testing.assert_array_equal(np.asarray(out), x * y + 1)
        assert not np.shares_memory(np.asarray(out), np.asarray(first))
    assert len(f._cache) == 1


def test_fast_path_keeps_the_shape_dtype_and_count_checks():
    f = tc.trace(lambda x: x + 1)
    x = np.ones(8, np.float32)
    f(x)
    np.testing.assert_array_equal(np.asarray(f(np.zeros(5, np.float32))), np.ones(5))   # retraces
    assert np.asarray(f(np.ones(8, np.float64))).dtype == np.float64                       # retraces
    with pytest.raises(TypeError):
        f(x, x)
    with pytest.raises(tc.ArgumentError):
        f._cache[next(iter(f._cache))].compiled([x, x])
    with pytest.raises(tc.ArgumentError, match="input 0 must be float32\\[8\\], got float32\\[4\\]"):
        f._cache[next(iter(f._cache))].compiled([np.ones(4, np.float32)])


def test_non_contiguous_misaligned_and_read_only_inputs_are_handled():
    f = tc.trace(lambda x: x * 2)
    base = np.arange(32, dtype=np.float32)
    f(base[:16])
    strided = base[::2]
    odd = np.frombuffer(np.arange(17, dtype=np.float32).tobytes()[2:66], np.float32)   # misaligned
    frozen = base[:16].copy()
    frozen.flags.writeable = False
    for x in (strided, odd, frozen):
        np.testing.assert_array_equal(np.asarray(f(x)), x * 2)


def test_index_inputs_are_still_bounds_checked_on_every_call():
    f = tc.trace(lambda x, i: tc.index_select(x, 0, i))
    x, good = np.arange(5, dtype=np.float32), np.array([0, 4], np.int64)
    np.testing.assert_array_equal(np.asarray(f(x, good)), x[good])
    with pytest.raises(tc.ShapeError, match="index 5 is out of bounds"):
        f(x, np.array([0, 5], np.int64))


def test_a_traced_function_called_inside_another_trace_is_inlined():
    """As JAX inlines a nested jit: its ops join the outer graph (they were refused before)."""
    f = tc.trace(lambda x: x + 1)
    f(np.ones(3, np.float32))
    g = tc.trace(lambda x: f(x) * 2)
    np.testing.assert_array_equal(np.asarray(g(np.ones(3, np.float32))), np.full(3, 4, np.float32))
    assert [op.name for op in g.lower(np.ones(3, np.float32)).graph.ops if op.name != "tc.constant"] == \
        ["tc.add", "tc.mul"]


def test_data_pointer_and_aligned_allocation():
    for a in (np.ones(7), np.arange(10, dtype=np.int32)[3:], np.zeros((3, 4), np.float32).T, np.ones(0)):
        assert data_pointer(a) == a.ctypes.data
    out, pointer = aligned_empty_at((5, 3), np.float64)
    assert out.shape == (5, 3) and pointer == out.ctypes.data and pointer % 64 == 0


def test_timings_cover_every_stage_of_a_gradient_compile():
    f = tc.trace(tc.grad(lambda w, x: ((x @ w).tanh() ** 2).sum()))
    w, x = np.ones((8, 4), np.float32), np.ones((3, 8), np.float32)
    t = f.lower(w, x).timings
    assert set(t) == set(timings.STAGES) - ({"llvm_opt", "machine_code"} if _cached(f, w, x) else set())
    assert all(s >= 0 for s in t.values()) and t["autodiff"] > 0 and t["lowering"] > 0


def _cached(f, *args) -> bool:
    """Whether the object code came from the compile cache (then LLVM did not run)."""
    return "llvm_opt" not in f.lower(*args).compile_times


def test_nested_stages_count_once():
    times: dict[str, float] = {}
    with timings.recording(times):
        with timings.stage("lowering"):
            with timings.stage("llvm_opt"):
                time.sleep(0.01)
            time.sleep(0.03)
            timings.add("autodiff", 0.02)      # measured inside "lowering": moves out of it
    assert set(times) == {"lowering", "llvm_opt", "autodiff"} and times["autodiff"] == 0.02
    assert 0.01 <= times["llvm_opt"] < 0.03 and 0.01 <= times["lowering"] < 0.03
    assert timings.summary(times).startswith("autodiff 20.0 ms, lowering ") and "total" in timings.summary(times)


def test_one_log_line_per_compile(caplog):
    caplog.set_level(logging.INFO, logger="tracecomp.transforms.trace")
    f = tc.trace(lambda x: x - 1)
    for n in (3, 3, 4):
        f(np.ones(n, np.float32))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled ")]
    assert len(lines) == 2 and "tensor<3xf32>" in lines[0] and "lowering" in lines[0] and "total" in lines[0]


_NO_CYCLES = """
import gc, numpy as np, tracecomp as tc
f = tc.trace(lambda d: {"sum": d["a"] + d["b"], "pair": (d["a"] * 2, [d["b"] - 1])})
arg = {"a": np.ones((64, 64), np.float32), "b": np.zeros((64, 64), np.float32)}
f(arg)                                         # compile outside the measured calls
gc.collect()
gc.disable()
gc.set_debug(gc.DEBUG_SAVEALL)
for _ in range(5):
    out = f(arg)
    assert float(np.asarray(out["pair"][1][0])[0, 0]) == -1.0
    del out
gc.collect()
cycles = list(gc.garbage)
assert cycles == [], f"{len(cycles)} objects in reference cycles, e.g. {cycles[:3]}"
"""


def test_a_call_leaves_no_reference_cycles():
    """Outputs and inputs are freed as soon as the caller drops them (no garbage cycle keeps
    them until the collector runs), so the next call reuses their memory.  In a process of
    its own: the collector also finds the cycles of other tests' threads (a Dask cluster's
    event loop still shutting down)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _NO_CYCLES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- large outputs are recycled

def _ptr(a) -> int:
    return data_pointer(np.asarray(a))


def test_a_large_output_reuses_the_block_of_one_nobody_holds():
    """BlockCache: once every array on an output's memory is gone, the next output of that
    size gets the same (already faulted-in) block."""
    f = tc.trace(lambda x: x * 2.0 + 1.0)
    x = np.random.default_rng(0).standard_normal(1 << 21).astype(np.float32)       # 8 MiB
    out = f(x)
    first = _ptr(out)
    assert first % 64 == 0 and np.asarray(out).flags.writeable
    del out
    again = f(x)
    assert _ptr(again) == first
    np.testing.assert_array_equal(np.asarray(again), x * 2.0 + 1.0)


def test_a_block_with_a_live_view_is_never_reused():
    f = tc.trace(lambda x: x + 1.0)
    x = np.zeros(1 << 21, np.float32)
    out = np.asarray(f(x))
    tail = out[5:][::2]                  # a view of a view: keeps the block alive alone
    del out
    newer = f(x + 5.0)
    assert not np.shares_memory(np.asarray(newer), tail)
    np.testing.assert_array_equal(tail, 1.0)


def test_the_cache_keeps_at_most_its_limit_of_free_blocks():
    from tracecomp.runtime.memory import BlockCache
    cache = BlockCache(limit=20 << 20)
    arrays = [cache.empty_at((1 << 20,), np.dtype(np.float32), (4 << 20) + 64)[0] for _ in range(8)]
    del arrays
    assert cache.free_bytes <= 20 << 20 and len(cache.free[(4 << 20) + 64]) == 4
    cache.clear()
    assert cache.free_bytes == 0


@pytest.mark.parametrize("n", [3, 12, 40])
def test_many_pointers_run_in_one_native_call_with_right_results(n):
    """Past DIRECT_POINTERS pointers the kernels run through the plan runner (one native
    call, pointers in an array); past MAX_ARITY a kernel takes ctypes arguments again."""
    from tracecomp.runtime import compiled
    f = tc.trace(lambda *xs: (sum(xs[1:], xs[0]) * 2, (xs[-1] - xs[0]).sum(0), xs[1] @ xs[2].T))
    rng = np.random.default_rng(n)
    for _ in range(3):                  # fresh arrays and outputs at every call
        xs = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(n)]
        got = f(*xs)
        want = (sum(xs) * 2, (xs[-1] - xs[0]).sum(0), xs[1] @ xs[2].T)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)
    program = next(iter(f._cache.values())).compiled
    kernels = program.program.kernels
    total, widest = sum(len(k.buffers) for k in kernels), max(len(k.buffers) for k in kernels)
    planned = total > compiled.DIRECT_POINTERS and widest <= compiled.MAX_ARITY
    assert (program._run_driver is not None) == planned
    assert planned == (n < compiled.MAX_ARITY)       # (40 inputs: one kernel takes 41 pointers)


def test_the_plan_runner_calls_each_kernel_with_the_pointers_its_plan_names():
    """The runner alone, on kernels written here: a plan of two kernels with arities 3 and
    0, positions in any order, and a kernel too wide for it that traps instead of running."""
    import ctypes
    from tracecomp.lower.llvm.control import plan_runner
    from tracecomp.runtime import jit
    text = plan_runner("run", 3) + """
define void @add(ptr %a, ptr %b, ptr %out) {
  %x = load i64, ptr %a
  %y = load i64, ptr %b
  %s = add i64 %x, %y
  store i64 %s, ptr %out
  ret void
}
@calls = global i64 0
define void @count() {
  %c = load i64, ptr @calls
  %d = add i64 %c, 1
  store i64 %d, ptr @calls
  ret void
}
define i64 @calls_so_far() {
  %c = load i64, ptr @calls
  ret i64 %c
}
"""
    lib = jit.default_engine().compile(text)
    run = lib.function("run", None, ctypes.c_void_p, ctypes.c_void_p)
    cells = (ctypes.c_int64 * 3)(5, 7, 0)
    buffers = (ctypes.c_uint64 * 3)(*[ctypes.addressof(cells) + 8 * i for i in (2, 0, 1)])  # out, a, b
    plan = (ctypes.c_uint64 * 8)(2, lib.address("add"), 3, 1, 2, 0, lib.address("count"), 0)
    run(ctypes.addressof(buffers), ctypes.addressof(plan))
    assert list(cells) == [5, 7, 12]
    assert lib.function("calls_so_far", ctypes.c_int64)() == 1
