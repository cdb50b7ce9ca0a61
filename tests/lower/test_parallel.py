"""The dynamic work split of parallel regions (llvm_parallel.claimed_chunks) and the loop and
matmul launchers built on it.

- A hand-built region (GOMP_parallel over `claimed_chunks`) records which thread ran each
  chunk and how often: every chunk runs exactly once for uneven sizes and any team size,
  and when thread 1 is held up in the first chunk it claims (usleep), thread 0 runs all
  the others instead of waiting (what a static split could not do), and the region, having
  kept its caller waiting at the end, sets the module's serial back-off (`start_team`).
- Compiled parallel loops and packed matmuls give exact / NumPy answers with teams of
  1, 2, 3 and 5 threads (more threads than chunks or cores, and uneven splits).
"""
from __future__ import annotations

import ctypes

import llvmlite.ir as ir
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.llvm import scalar as S
from tracecomp.lower.llvm.parallel import claimed_chunks, mark_done, recently_late, start_team, struct_field
from tracecomp.runtime import jit

_PTR = ir.PointerType()


def _region_module() -> ir.Module:
    """`i1 region(i64* owner, i64* runs, i64 n, i64 size, i64 sleep_us, i32 threads)`:
    a team of `threads` claims the chunks of [0, n) in `size` steps; for each chunk c it
    sets owner[c] = thread id and runs[c] += 1, and thread 1 sleeps `sleep_us` in the first
    chunk it claims.  The team starts through `start_team`; the result is `recently_late`
    right after it (whether later regions of the module would run serially)."""
    module = ir.Module("claims")
    struct = ir.LiteralStructType([_PTR, _PTR, S.I64, S.I64, S.I64, S.I64, S.I64])  # ..., counter, done
    omp = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR]), "region.omp")
    b = ir.IRBuilder(omp.append_basic_block("entry"))
    owner, runs, n, size = [b.load(struct_field(b, omp.args[0], struct, k), typ=t)
                            for k, t in enumerate(struct.elements[:4])]
    sleep_us_slot = b.alloca(S.I64)           # this thread's own copy
    b.store(b.load(struct_field(b, omp.args[0], struct, 4), typ=S.I64), sleep_us_slot)
    usleep = S.declare(module, "usleep", S.I32, [S.I32])
    with claimed_chunks(b, module, struct_field(b, omp.args[0], struct, 5), n, size) as (tid, lo, _):
        chunk = b.sdiv(lo, size)
        b.store(tid, b.gep(owner, [chunk], source_etype=S.I64))
        slot = b.gep(runs, [chunk], source_etype=S.I64)
        b.store(b.add(b.load(slot, typ=S.I64), ir.Constant(S.I64, 1)), slot)
        with b.if_then(b.icmp_signed("==", tid, ir.Constant(S.I64, 1))):
            b.call(usleep, [b.trunc(b.load(sleep_us_slot, typ=S.I64), S.I32)])
            b.store(ir.Constant(S.I64, 0), sleep_us_slot)          # only in the first chunk
    mark_done(b, tid, struct_field(b, omp.args[0], struct, 6))
    b.ret_void()

    region = ir.Function(module, ir.FunctionType(S.I8, [_PTR, _PTR, S.I64, S.I64, S.I64, S.I32]), "region")
    b = ir.IRBuilder(region.append_basic_block("entry"))
    data = b.alloca(struct)
    for k, value in enumerate(list(region.args[:5]) + [ir.Constant(S.I64, 0)] * 2):
        b.store(value, struct_field(b, data, struct, k))
    start_team(b, omp, data, struct_field(b, data, struct, 6), region.args[5])
    b.ret(b.zext(recently_late(b), S.I8))
    return module


@pytest.fixture(scope="module")
def region():
    lib = jit.compile_module(_region_module())
    fn = lib.function("region", ctypes.c_int8, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_int64, ctypes.c_int32)

    def run(n: int, size: int, threads: int, sleep_us: int = 0, late: list | None = None):
        chunks = -(-n // size)
        owner, runs = np.full(chunks, -1, np.int64), np.zeros(chunks, np.int64)
        was_late = fn(owner.ctypes.data, runs.ctypes.data, n, size, sleep_us, threads)
        if late is not None:
            late.append(bool(was_late))
        return owner, runs
    return run


@pytest.mark.parametrize("n,size,threads", [(1, 1, 2), (7, 1, 3), (10, 3, 2), (100, 7, 5), (5, 10, 2),
                                            (64, 1, 1), (3, 1, 8), (1000, 33, 2)])
def test_every_chunk_runs_exactly_once(region, n, size, threads):
    owner, runs = region(n, size, threads)
    assert (runs == 1).all(), runs
    assert ((owner >= 0) & (owner < threads)).all()
    if threads == 1:
        assert (owner == 0).all()


def test_a_held_up_thread_leaves_its_share_to_the_other(region):
    """Thread 1 sleeps 0.3 s in the first chunk it claims; with a static split it would own
    half of the 64 chunks, here thread 0 claims all the rest while it sleeps."""
    late = []
    owner, runs = region(64, 1, 2, sleep_us=300_000, late=late)
    assert (runs == 1).all()
    assert (owner == 0).sum() >= 60, owner                   # a little slack for a loaded machine
    if (owner == 1).any():         # thread 1 slept in a chunk: the caller waited for it at the end
        assert late == [True]      # so the module's next regions run serially for a while


@pytest.fixture
def team_size():
    """Sets the libgomp team size for the calling thread (restored afterwards)."""
    gomp = ctypes.CDLL(jit.load_system_library("gomp"))
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    before = gomp.omp_get_max_threads()
    yield gomp.omp_set_num_threads
    gomp.omp_set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(1001, 1003), (3, 40000), (40000, 3), (2, 2, 9000)])
def test_parallel_loops_with_any_team_size(team_size, threads, shape):
    team_size(threads)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    got = tc.trace(lambda a: a * 2 + 1)(x)
    np.testing.assert_array_equal(np.asarray(got), x * 2 + 1)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 97, 130), (3, 130, 111)), ((300, 200), (200, 40)),
                                             ((40, 200), (200, 300)), ((5, 64, 64), (64, 72)),
                                             ((1, 129, 257), (257, 65))])
def test_packed_matmuls_with_any_team_size(team_size, threads, a_shape, b_shape):
    team_size(threads)
    rng = np.random.default_rng(sum(a_shape) + threads)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    got = np.asarray(tc.trace(lambda x, y: tc.relu(x @ y) - 1)(a, b))
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0) - 1
    k = a_shape[-1]
    assert np.abs(got - want).max() <= 4 * k * np.finfo(np.float32).eps * (np.abs(want).max() + 1)
