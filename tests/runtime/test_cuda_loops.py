"""Loops and branches on the PTX path (issue 35): the runner walks the steps on the host and
launches the regions' kernels, here on the host emulator of runtime/cuda/emulator.py, and on
the GPU where there is one."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.nvptx.program import compile_program
from tracecomp.lower.schedule.scheduler import schedule
from tracecomp.runtime.cuda import driver
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.runner import CudaProgram
from tracecomp.runtime.interpreter import run_graph

from lower import region_graphs as RG

SLOW = {"scan_mixed_carries"}        # block reductions in every step: seconds on the emulator
CASES = [pytest.param(g, ins, id=name) for name, g, ins in RG.cases() if name not in SLOW]


@pytest.mark.parametrize("graph,inputs", CASES)
def test_emulated_loops_match_the_interpreter(graph, inputs):
    RG.assert_close(CudaProgram(schedule(graph), EmulatedContext()).on_host(inputs), run_graph(graph, inputs))


@pytest.mark.skipif(not driver.available(), reason="no CUDA GPU and driver on this machine")
@pytest.mark.parametrize("graph,inputs", [pytest.param(g, ins, id=name) for name, g, ins in RG.cases()])
def test_gpu_loops_match_the_interpreter(graph, inputs):
    RG.assert_close(CudaProgram(schedule(graph)).on_host(inputs), run_graph(graph, inputs))


def test_one_launch_per_kernel_per_step_and_no_loop_in_the_ptx():
    """The PTX holds the body's kernels once; the host launches them once per step."""
    program = schedule(RG.scan_tanh(7))
    assert len(compile_program(program).launches) == len(program.kernels)
    runner = CudaProgram(program, EmulatedContext())
    launched = []
    launch = runner.ctx.launch
    runner.ctx.launch = lambda fn, *a, **k: (launched.append(fn[1]), launch(fn, *a, **k))
    g = RG.scan_tanh(7)
    ins = RG.inputs_for(g)
    RG.assert_close(runner.on_host(ins), run_graph(g, ins))
    assert len(launched) == 7 * len(program.kernels)


def test_a_traced_while_loop_on_the_emulator():
    def f(n, x):
        return tc.fori_loop(0, n, lambda i, v: v * 0.5 + i, x)
    args = [np.int64(4), np.arange(5, dtype=np.float32)]
    low = tc.trace(f).lower(*args)
    got = CudaProgram(low.program, EmulatedContext()).on_host([np.asarray(a) for a in args])
    np.testing.assert_allclose(got[0], np.asarray(tc.trace(f, backend="interp")(*args)), rtol=1e-6)


def test_export_target_cuda_describes_the_steps(tmp_path):
    import json

    def f(n, x):
        return tc.fori_loop(0, n, lambda i, v: v * 0.5 + i, x)
    tc.export(f, [np.int64(3), np.ones(4, np.float32)], str(tmp_path / "loop.ptx"), target="cuda")
    js = json.loads((tmp_path / "loop.json").read_text())
    kinds = [s["kind"] for s in js["steps"]]
    assert "while" in kinds
    loop = js["steps"][kinds.index("while")]
    assert set(loop) >= {"cond", "body", "init", "carry", "spare", "consts"}
    runs = [s["kernel"] for block in (loop["cond"], loop["body"]) for s in block["steps"] if s["kind"] == "run"]
    launched = {launch["kernel"] for launch in js["launches"]}
    assert runs and set(runs) <= launched
    assert all(js["buffers"][n]["role"] == "bound" for n in loop["body"]["inputs"] + loop["body"]["outputs"])


def test_random_draws_in_a_scan_body_on_the_emulator():
    def f(c):
        return tc.scan(lambda c, _: (c + tc.rand(3), tc.randn(2)), c, None, length=6)
    x = np.zeros(3, np.float32)
    low = tc.trace(f).lower(x)
    c, noise = CudaProgram(low.program, EmulatedContext()).on_host([x])
    assert noise.shape == (6, 2) and len({tuple(r) for r in noise}) == 6
    assert np.all((c > 0) & (c < 6))
