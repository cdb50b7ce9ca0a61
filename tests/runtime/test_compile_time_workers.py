"""Compiling a module in parts on forked workers (tracecomp/runtime/compile_worker.py): the
split, results equal to one process's, the compile cache with several objects, and every
way a worker can fail (exception, death, hang) ending in a compile in this process."""
import json
import logging
import os
import time

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import BackendError
from tracecomp.runtime import cache, compile_worker, jit

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="compile workers need os.fork")


def mlp(x, w1, w2, w3):
    """Three products and their fused tails: several kernels, each worth a group."""
    h = tc.relu(x @ w1 + 1.0)
    h = tc.tanh(h @ w2)
    return (h @ w3).exp().sum(dim=1)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(64, 48), (48, 40), (40, 40), (40, 24)]
    return [rng.standard_normal(s).astype(np.float32) * 0.2 for s in shapes]


def expected(x, w1, w2, w3):
    x, w1, w2, w3 = (a.astype(np.float64) for a in (x, w1, w2, w3))
    h = np.maximum(x @ w1 + 1.0, 0)
    h = np.tanh(h @ w2)
    return np.exp(h @ w3).sum(axis=1)


def run_mlp(seed=0):
    args = inputs(seed)
    out = np.asarray(tc.trace(mlp)(*args))
    np.testing.assert_allclose(out, expected(*args), rtol=1e-4, atol=1e-4)
    return out


@pytest.fixture
def split_everything(monkeypatch):
    """Two processes for any module of two kernels or more; the compile cache off.  Yields
    the workers started, which the test checks are all reaped."""
    monkeypatch.setenv(compile_worker.PROCESSES_ENV, "2")
    monkeypatch.setattr(compile_worker, "MIN_SPLIT_WEIGHT", 1)
    monkeypatch.setattr(cache.settings, "_enabled", False)
    started, start = [], compile_worker._start_worker

    def recorded(*args):
        worker = start(*args)
        if worker is not None:
            started.append(worker.pid)
        return worker
    monkeypatch.setattr(compile_worker, "_start_worker", recorded)
    yield started
    for pid in started:
        with pytest.raises(ChildProcessError):       # reaped: no zombie, nothing running
            os.waitpid(pid, os.WNOHANG)


@pytest.fixture
def worker_log(caplog):
    caplog.set_level(logging.DEBUG, logger="tracecomp.compile_worker")
    return caplog


def in_worker(parent: int) -> bool:
    return os.getpid() != parent


# ----------------------------------------------------------------------------- the split

class FakeKernel:
    def __init__(self, name, size, matmuls=0):
        self.name, self.text = name, "x" * size + "Matmul(" * matmuls
        self.body = []            # no math functions

    def __repr__(self):
        return self.text


def test_split_balances_weight_and_keeps_the_kernels_order(monkeypatch):
    monkeypatch.setattr(compile_worker, "MIN_SPLIT_WEIGHT", 100)
    ks = [FakeKernel("a", 900), FakeKernel("b", 100, matmuls=1), FakeKernel("c", 500), FakeKernel("d", 400),
          FakeKernel("e", 2000)]
    groups = compile_worker.split(ks, 2)
    assert len(groups) == 2 and sorted(k.name for g in groups for k in g) == list("abcde")
    for g in groups:
        assert [ks.index(k) for k in g] == sorted(ks.index(k) for k in g)
    loads = [sum(compile_worker.kernel_weight(k) for k in g) for g in groups]
    assert max(loads) - min(loads) <= max(compile_worker.kernel_weight(k) for k in ks)


def test_light_modules_and_one_process_are_one_group(monkeypatch):
    ks = [FakeKernel("a", 50), FakeKernel("b", 50)]
    assert compile_worker.split(ks, 2) == [ks]                 # far below MIN_SPLIT_WEIGHT
    monkeypatch.setattr(compile_worker, "MIN_SPLIT_WEIGHT", 1)
    assert len(compile_worker.split(ks, 2)) == 2
    assert compile_worker.split(ks, 1) == [ks]
    assert compile_worker.split(ks[:1], 4) == [ks[:1]]


def test_the_process_count_setting(monkeypatch, caplog):
    monkeypatch.setenv(compile_worker.PROCESSES_ENV, "1")
    assert compile_worker.allowed_processes() == 1
    monkeypatch.setenv(compile_worker.PROCESSES_ENV, "3")
    assert compile_worker.allowed_processes() == 3
    monkeypatch.setenv(compile_worker.PROCESSES_ENV, "many")
    with caplog.at_level(logging.WARNING, logger="tracecomp.compile_worker"):
        assert compile_worker.allowed_processes() == 1
    assert "not a number" in caplog.text
    monkeypatch.delenv(compile_worker.PROCESSES_ENV)
    assert compile_worker.allowed_processes() == min(2, len(os.sched_getaffinity(0)))
    monkeypatch.setattr(compile_worker, "FORK_MAX_RSS", 1 << 20)      # this process is bigger
    assert compile_worker.allowed_processes() == 1


# ----------------------------------------------------------------------------- results

def test_a_module_compiled_in_parts_computes_what_one_process_does(split_everything, worker_log):
    parts = run_mlp()
    assert len(split_everything) == 1
    assert "in worker" in worker_log.text and "compile worker" in worker_log.text
    os.environ[compile_worker.PROCESSES_ENV] = "1"
    try:
        whole = run_mlp()
    finally:
        os.environ[compile_worker.PROCESSES_ENV] = "2"
    np.testing.assert_array_equal(parts, whole)


def test_three_processes(split_everything, monkeypatch, worker_log):
    monkeypatch.setenv(compile_worker.PROCESSES_ENV, "3")
    run_mlp(seed=3)
    assert len(split_everything) == 2


def test_the_cache_stores_and_loads_an_entry_of_several_objects(split_everything, tmp_path, monkeypatch):
    monkeypatch.setattr(cache.settings, "_enabled", True)
    monkeypatch.setattr(cache.settings, "_directory", tmp_path)
    monkeypatch.setattr(cache.settings, "stats", cache.CacheStats())
    first = run_mlp(seed=1)
    (meta_path,) = tmp_path.glob(f"v{cache.FORMAT}/*/*.json")   # the entry (a tuning record sits beside it)
    meta = json.loads(meta_path.read_text())
    assert len(meta["object_sizes"]) == 2 and sum(meta["object_sizes"]) == meta["object_size"]
    np.testing.assert_array_equal(run_mlp(seed=1), first)      # a new trace: linked from disk
    assert cache.settings.stats == cache.CacheStats(hits=1, misses=1, stores=1)


def test_object_sizes_that_do_not_add_up_are_refused():
    code = jit.ObjectCode(b"x" * 10, ("f",), (), (4, 5))
    with pytest.raises(BackendError, match="cannot hold"):
        code.objects()
    meta = {"format": cache.FORMAT, "key": "k", "object_size": 10, "exports": ["f"],
            "system_libraries": [], "object_sizes": [4, 5],
            "object_sha256": __import__("hashlib").sha256(b"x" * 10).hexdigest()}
    with pytest.raises(cache.CorruptEntry, match="add up"):
        cache._checked(meta, b"x" * 10, "k")


def test_joined_code_lists_every_object_and_export():
    a = jit.ObjectCode(b"aaa", ("f",), ("m",))
    b = jit.ObjectCode(b"bb", ("g", "h"), ("gomp", "m"))
    joined = jit.ObjectCode.joined([a, b])
    assert joined.objects() == [b"aaa", b"bb"] and joined.exports == ("f", "g", "h")
    assert joined.system_libraries == ("gomp", "m") and joined.object_sizes == (3, 2)


# ----------------------------------------------------------------------------- failures

def _raise_in_worker():
    raise RuntimeError("worker trouble")


@pytest.mark.parametrize("misbehave, logged", [
    (_raise_in_worker, "RuntimeError: worker trouble"),
    (lambda: os._exit(7), "ended without an answer"),
    (lambda: time.sleep(600), "did not answer in time"),
], ids=["raises", "dies", "hangs"])
def test_a_worker_that_fails_leaves_its_part_to_this_process(misbehave, logged, split_everything,
                                                             monkeypatch, worker_log):
    """A worker that raises, dies or hangs (killed after the timeout): this process compiles
    the worker's part itself, and the log says what happened."""
    parent, compile_ = os.getpid(), compile_worker._compile

    def failing_in_worker(*args, **kwargs):
        if in_worker(parent):
            misbehave()
        return compile_(*args, **kwargs)
    monkeypatch.setattr(compile_worker, "_compile", failing_in_worker)
    monkeypatch.setattr(compile_worker, "WORKER_TIMEOUT_MIN_S", 1.0)
    started = time.perf_counter()
    run_mlp(seed=4)
    assert time.perf_counter() - started < 60
    assert logged in worker_log.text


def test_a_compile_error_is_raised_here_with_its_message(split_everything, monkeypatch):
    def broken(*args, **kwargs):
        raise BackendError("kernel 'k' cannot be compiled: made up")
    monkeypatch.setattr(compile_worker, "_compile", broken)
    with pytest.raises(BackendError, match="made up"):
        tc.trace(mlp)(*inputs(seed=7))


def test_a_failed_fork_compiles_everything_here(split_everything, monkeypatch, worker_log):
    def no_fork():
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(compile_worker.os, "fork", no_fork)
    run_mlp(seed=8)
    assert "fork failed" in worker_log.text and not split_everything


def test_split_modules_declare_the_matmul_helpers_that_group_0_defines():
    from tracecomp.core.dtypes import DType
    from tracecomp.lower.llvm.gemm import nest
    from tracecomp.lower.llvm.gemm import microkernel as uk
    from tracecomp.lower.llvm.codegen import codegen_kernels
    from tracecomp.lower.schedule.scheduler import schedule
    program = schedule(tc.trace(mlp).lower(*inputs()).optimized)
    assert compile_worker.packed_matmul_dtypes(program.kernels) == [DType.float32]
    helpers = nest.helper_names([DType.float32])
    with uk.helpers_defined_elsewhere([DType.float32]):
        module = codegen_kernels(program.kernels, "g1", align=None)
    used = [f for f in module.functions if f.name in helpers]
    assert used and all(f.is_declaration for f in used)
    assert nest.define_helpers(module, [DType.float32]) == helpers
    for name in helpers:
        fn = module.globals[name]
        assert not fn.is_declaration and fn.linkage == "external"
    plain = codegen_kernels(program.kernels, "whole", align=None)      # unsplit: internal helpers
    assert all(plain.globals[f.name].linkage == "internal" for f in used)


def test_products_of_two_dtypes_and_batched_epilogues_in_parts(split_everything, worker_log):
    """Helpers of both dtypes defined in group 0; an epilogue that reads a batched operand
    through the batch index (a visible name in the nest's context)."""
    rng = np.random.default_rng(11)
    a32, b32 = rng.standard_normal((3, 40, 24)).astype(np.float32), rng.standard_normal((24, 36)).astype(np.float32)
    c32 = rng.standard_normal((3, 40, 36)).astype(np.float32)
    a64, b64 = rng.standard_normal((33, 17)), rng.standard_normal((17, 45))

    def fn(a32, b32, c32, a64, b64):
        return tc.tanh(a32 @ b32) * c32, (a64 @ b64).exp().sum(dim=0)
    got32, got64 = tc.trace(fn)(a32, b32, c32, a64, b64)
    np.testing.assert_allclose(np.asarray(got32), np.tanh(a32.astype(np.float64) @ b32) * c32, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got64), np.exp(a64 @ b64).sum(axis=0), rtol=1e-10)
    assert len(split_everything) == 1 and "in worker" in worker_log.text


def test_a_math_function_weighs_like_the_polynomial_it_inlines():
    """kernel_weight counts each math function applied (MATH_WEIGHT): W8's GELU-derivative
    product compiled in 130-190 ms where its loop IR's size said 50."""
    from tracecomp.core.dtypes import DType
    from tracecomp.lower.loops.ir import INDEX, Buffer, Kernel, Load, Loop, Store, Unary, Var
    i, f32 = Var("i", INDEX), DType.float32

    def kernel(fn):
        x = Load("x", (i,), f32)
        return Kernel("k", [Buffer("x", f32, (64,), "input"), Buffer("y", f32, (64,), "output")],
                      [Loop("i", 64, [Store("y", (i,), Unary(fn, x, f32))])])
    assert compile_worker.kernel_weight(kernel("erf")) - compile_worker.kernel_weight(kernel("neg")) \
        >= compile_worker.MATH_WEIGHT
