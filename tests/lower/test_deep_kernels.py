"""Long chains of ops (unrolled loops, issue 35): the scheduler bounds how deep a kernel's
expressions get (schedule/depth.py), so compiling never recurses as deep as the chain is
long; the workspace plan's fast path makes the choices of the general one."""
from __future__ import annotations

import random

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.schedule import workspace
from tracecomp.lower.schedule.depth import MAX_LEVELS, MAX_OPS, expression_depth, op_levels
from tracecomp.lower.schedule.scheduler import schedule


def _deepest(program) -> int:
    return max(expression_depth(k.body) for k in program.kernels)


def _chain(op, n, scale=1.0):
    def fn(x):
        for _ in range(n):
            x = op(x * scale) if scale != 1.0 else op(x)
        return x
    return fn


def test_a_2000_step_elementwise_chain_compiles_in_kernels_of_bounded_depth():
    x = np.random.default_rng(0).uniform(-2, 2, (4, 8)).astype(np.float32)
    fn = _chain(tc.tanh, 2000)
    graph = tc.trace(fn).lower(x).optimized
    program = schedule(graph)
    assert len(program.kernels) >= 2000 // (MAX_OPS + 1)
    assert _deepest(program) <= MAX_LEVELS + max(op_levels(op) for op in graph.ops)
    want = x.astype(np.float64)
    for _ in range(2000):
        want = np.tanh(want)
    np.testing.assert_allclose(np.asarray(tc.trace(fn)(x)), want, rtol=1e-4, atol=1e-6)


def test_deep_ops_split_sooner():
    """erfinv alone is ~140 levels deep: 30 of them in a row would be ~4,000 levels."""
    x = np.random.default_rng(1).uniform(-0.9, 0.9, (16,)).astype(np.float32)
    fn = _chain(tc.erfinv, 30, scale=0.5)
    graph = tc.trace(fn).lower(x).optimized
    program = schedule(graph)
    assert _deepest(program) <= MAX_LEVELS + max(op_levels(op) for op in graph.ops)
    want = fn(tc.tensor(x.astype(np.float64)))
    np.testing.assert_allclose(np.asarray(tc.trace(fn)(x)), want.numpy(), rtol=1e-4, atol=1e-6)


def test_a_matmul_epilogue_stops_growing_at_the_cap():
    rng = np.random.default_rng(2)
    a, w = rng.standard_normal((8, 16)).astype(np.float32), (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)

    def fn(a, w):
        return _chain(tc.tanh, 400)(a @ w)
    graph = tc.trace(fn).lower(a, w).optimized
    assert _deepest(schedule(graph)) <= MAX_LEVELS + max(op_levels(op) for op in graph.ops)
    want = a.astype(np.float64) @ w.astype(np.float64)
    for _ in range(400):
        want = np.tanh(want)
    np.testing.assert_allclose(np.asarray(tc.trace(fn)(a, w)), want, rtol=1e-4, atol=1e-5)


class _Size(int):
    """An int the workspace planner does not take for one (it then uses its general path)."""


@pytest.mark.parametrize("seed", range(20))
def test_the_static_workspace_plan_chooses_as_the_general_one(seed):
    r = random.Random(seed)
    for _ in range(50):
        n = r.randint(0, 40)
        temps = {f"t{i}": r.choice([1, 4, 8, 16, 64, r.randint(1, 100)]) for i in range(n)}
        first = {k: r.randint(-1, 25) for k in temps}
        last = {k: first[k] + r.randint(0, 8) for k in temps}
        fast = workspace.plan_workspace(temps, first, last)
        general = workspace.plan_workspace({k: _Size(v) for k, v in temps.items()}, first, last)
        assert fast == general
