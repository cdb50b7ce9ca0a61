"""Compiled loops and branches (issue 35): a Program with control steps runs in one native
call (the driver of llvm/control.py) and gives the interpreter's results."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import ShapeError
from tracecomp.lower.schedule.scheduler import schedule
from tracecomp.runtime.compiled import CompiledProgram
from tracecomp.runtime.interpreter import run_graph

from lower import region_graphs as RG
CASES = [pytest.param(g, ins, id=name) for name, g, ins in RG.cases()]
assert_close = RG.assert_close


@pytest.mark.parametrize("graph,inputs", CASES)
def test_compiled_matches_the_interpreter(graph, inputs):
    compiled = CompiledProgram(schedule(graph))
    want = run_graph(graph, inputs)
    assert_close(compiled(inputs), want)
    assert_close(compiled(inputs), want)        # again: the workspace and spares are reused


def test_a_long_scan_is_one_native_call():
    """10,000 steps: one ctypes call (the driver), and as many kernels as for 10 steps."""
    short, long = schedule(RG.scan_tanh(10)), schedule(RG.scan_tanh(10_000))
    assert len(short.kernels) == len(long.kernels)
    compiled = CompiledProgram(long)
    assert compiled._calls == [] and compiled._run_driver is not None
    calls = []
    run = compiled._run_driver

    def counting(pointers):
        calls.append(1)
        return run(pointers)
    compiled._run_driver = counting
    g = RG.scan_tanh(10_000)
    ins = RG.inputs_for(g)
    got = compiled(ins)
    assert len(calls) == 1
    assert_close(got, run_graph(g, ins))


def test_index_checks_inside_a_loop_body_raise_after_the_call():
    """A gather whose index comes from the carry: checked in the kernel, reported after."""
    s, i = RG.T((5,)), RG.T((), tc.int64)
    body = RG.region(lambda table, k: (k + 2, table[k]), s, i)
    g = RG.Graph("main", [s, i])
    g.outputs = list(RG.scan(g, body, [g.inputs[0]], [g.inputs[1]], [], 3))
    compiled = CompiledProgram(schedule(RG.checked(g)))
    table = np.arange(5, dtype=np.float32)
    ok = [table, np.int64(0)]
    assert_close(compiled(ok), run_graph(g, ok))
    with pytest.raises(ShapeError, match="index 5 is out of bounds for dim 0 with size 5"):
        compiled([table, np.int64(1)])
    assert_close(compiled(ok), run_graph(g, ok))      # the record was cleared


# ------------------------------------------------------------ traced with tc.scan & co

def _both(fn, *args):
    got = tc.trace(fn)(*args)
    want = tc.trace(fn, backend="interp")(*args)
    return [np.asarray(t) for t in (got if isinstance(got, tuple) else (got,))], \
           [np.asarray(t) for t in (want if isinstance(want, tuple) else (want,))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_traced_control_flow_matches_the_interpreter(dtype):
    rng = np.random.default_rng(1)
    c, a, xs = (rng.standard_normal(s).astype(dtype) for s in ((4, 5), (4, 5), (9, 4, 5)))

    def f(c, a, xs, n):
        c2, ys = tc.scan(lambda c, x: ((c * a + x).tanh(), c.sum()), c, xs, reverse=True)
        v = tc.fori_loop(0, n, lambda i, v: v * 0.5 + i, c2)
        w = tc.while_loop(lambda v: v.abs().sum() < 1000, lambda v: v * 2 + 1, v)
        z = tc.cond(w.sum() > 0, lambda u: u - 1, lambda u: -u, w)
        return ys, z
    got, want = _both(f, c, a, xs, np.int64(5))
    assert_close(got, want)


def test_a_traced_scan_shows_its_loop_in_every_stage():
    def f(c, xs):
        return tc.scan(lambda c, x: ((c * 2 + x).tanh(), c.sum()), c, xs)
    low = tc.trace(f).lower(np.ones(8, np.float32), np.ones((100, 8), np.float32))
    loops = low.as_text("loops")
    assert "func.func @f_driver" in loops and "scf.for" in loops and "func.call @k0r0_" in loops
    llvm = low.as_text("llvm")
    assert "define void @tc_f_driver" in llvm and "call void @k0r0_" in llvm
    assert "tc_f_driver" in low.as_text("asm")


def test_the_driver_comes_from_the_compile_cache():
    from tracecomp.runtime import cache
    if not cache.settings.enabled:
        pytest.skip("the compile cache is off")
    CompiledProgram(schedule(RG.scan_tanh(6)))
    before = cache.settings.stats.hits
    compiled = CompiledProgram(schedule(RG.scan_tanh(6)))
    assert cache.settings.stats.hits == before + 2          # the kernels' library and the driver
    g = RG.scan_tanh(6)
    ins = RG.inputs_for(g)
    assert_close(compiled(ins), run_graph(g, ins))


def test_random_draws_in_loop_bodies_are_new_every_step_and_follow_manual_seed():
    def f(c):
        def step(c, _):
            inner, noise = tc.scan(lambda d, _: (d + tc.rand(4), tc.randn(2)), c, None, length=3)
            return tc.cond(inner.sum() > -1, lambda u: u + tc.rand(4), lambda u: u, inner), noise
        return tc.scan(step, c, None, length=40)
    g = tc.trace(f)
    x = np.zeros(4, np.float32)
    c, noise = (np.asarray(t) for t in g(x))
    assert noise.shape == (40, 3, 2) and len({tuple(r) for r in noise.reshape(-1, 2)}) == 120
    assert abs(noise.mean()) < 0.3 and 0.7 < noise.std() < 1.3
    assert np.all((c > 40 * 3 * 0.5 * 0.5) & (c < 40 * 4 * 0.5 * 1.5))      # 160 uniform draws, mean 80
    assert not np.array_equal(np.asarray(g(x)[1]), noise)
    tc.manual_seed(7)
    a = [np.asarray(t) for t in g(x)]
    tc.manual_seed(7)
    b = [np.asarray(t) for t in g(x)]
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
