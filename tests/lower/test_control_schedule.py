"""Region ops scheduled into control steps around their regions' kernels (schedule/control.py),
run by the loop-IR interpreter against the graph interpreter."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import BackendError
from tracecomp.lower.loops import control as C
from tracecomp.ir.mlir_tool import find_mlir_opt
from tracecomp.lower.loops.interp import run_program
from tracecomp.lower.loops.steps_printer import print_program
from tracecomp.lower.schedule.scheduler import schedule
from tracecomp.lower.schedule.workspace import plan_program
from tracecomp.runtime.interpreter import run_graph

from lower import region_graphs as RG


CASES = [pytest.param(g, ins, id=name) for name, g, ins in RG.cases()]
assert_close = RG.assert_close


@pytest.mark.parametrize("graph,inputs", CASES)
def test_steps_match_the_interpreter(graph, inputs):
    program = schedule(graph)
    assert program.steps is not None
    assert_close(run_program(program, inputs), run_graph(graph, inputs))


def test_scan_steps_and_bound_buffers():
    program = schedule(RG.scan_tanh(5))
    (step,) = [s for s in program.steps if not isinstance(s, C.Run)]
    assert isinstance(step, C.Scan) and step.length == 5 and len(step.spare) == 1
    body = step.body
    assert all(program.buffers[n].role == "bound" for n in body.inputs + body.outputs)
    assert set(C.kernels_run(program.steps)) == {k.name for k in program.kernels}
    assert "scan length=5" in C.describe(program.steps)


def test_kernel_count_does_not_depend_on_the_length():
    assert len(schedule(RG.scan_tanh(10)).kernels) == len(schedule(RG.scan_tanh(10_000)).kernels)


def test_a_carry_needs_no_spare_below_two_steps():
    for n, spares in ((0, [None]), (1, [None])):
        (step,) = [s for s in schedule(RG.scan_tanh(n)).steps if isinstance(s, C.Scan)]
        assert step.spare == spares


def test_yields_that_are_not_fresh_values_are_copied():
    program = schedule(RG.scan_passthrough())
    (step,) = [s for s in program.steps if isinstance(s, C.Scan)]
    outputs = step.body.outputs
    assert len(set(outputs)) == len(outputs)
    assert not set(outputs) & set(step.body.inputs)
    assert sum("yield" in k.name for k in program.kernels) == 6


def test_a_carry_yielded_unchanged_stays_in_place_without_a_spare_or_a_copy():
    for g, copies in ((RG.scan_invariant_carry(5), ["yield2"]), (RG.while_invariant_bound(), [])):
        program = schedule(g)
        (step,) = [st for st in program.steps if not isinstance(st, C.Run)]
        assert C.invariant(step) == [False, True] + [False] * (len(step.init) - 2)
        assert step.spare[1] is None and step.spare[0] is not None
        # (the scan's y is its carry's block argument: that one is copied, into the row)
        assert [k.name.rsplit("_", 1)[1] for k in program.kernels if "yield" in k.name] == copies


def test_body_temps_do_not_share_memory_with_what_lives_across_the_loop():
    """Outer buffers the loop uses live across all of its span in the workspace plan."""
    s = RG.T((8,))
    g = RG.Graph("main", [s, RG.T((5, 8))])
    x, xs = g.inputs
    pre, = RG.inline(g, RG.region(lambda x: (x * 3).exp(), s), [x])          # a temp read after the loop
    body = RG.region(lambda k, c, r: ((c * k + r).tanh() * (c + 1).exp(), (c - r).exp()), s, s, s)
    c, ys = RG.scan(g, body, [pre], [pre], [xs], 5)
    out, = RG.inline(g, RG.region(lambda a, b: a + b.sum(), s, RG.T((5, 8))), [pre, ys])
    g.outputs = [c, out]
    program = schedule(RG.checked(g))
    assignment, _ = plan_program(program)
    (step,) = [st for st in program.steps if isinstance(st, C.Scan)]
    outer = {n for n in C.outer_buffers(step) if n in assignment}
    inner = {n for n in assignment if n.startswith(step.body.steps[0].kernel.split("_", 1)[0])}
    assert outer and all(assignment[a] != assignment[b] for a in outer for b in inner)
    ins = RG.inputs_for(g)
    assert_close(run_program(program, ins), run_graph(g, ins))


def test_random_draws_in_a_while_loop_are_refused():
    s = RG.T((3,))
    g = RG.Graph("main", [s])
    g.outputs = list(RG.while_loop(g, RG.region(lambda c: c.sum() < 10, s), RG.region(lambda c: c + tc.rand(3), s),
                                   [], [g.inputs[0]]))
    with pytest.raises(BackendError, match="random draws inside a compiled while loop"):
        schedule(g)


def test_a_scan_draws_for_all_its_steps_before_the_kernels():
    """A fill of shape S in the body is a fill of (length, *S) outside, scanned row by row."""
    s = RG.T((3,))
    body = RG.region(lambda c: (c + tc.rand(3), tc.randn(2)), s)
    g = RG.Graph("main", [s])
    g.outputs = list(RG.scan(g, body, [], [g.inputs[0]], [], 7))
    program = schedule(g)
    assert sorted(f.shape for f in program.fills) == [(7, 2), (7, 3)]
    (step,) = [st for st in program.steps if isinstance(st, C.Scan)]
    assert {f.buffer for f in program.fills} == set(step.xs)


MLIR_OPT = find_mlir_opt()


@pytest.mark.skipif(MLIR_OPT is None, reason="mlir-opt not found (not in /usr/lib/llvm-22/bin nor on PATH)")
@pytest.mark.mlir
def test_the_loops_stage_with_its_driver_is_valid_mlir():
    """Every case's kernels and driver (scf.for / scf.while / scf.if around func.calls) parse
    and verify with plain mlir-opt (no unregistered dialects)."""
    for name, g, _ in RG.cases():
        text = print_program(schedule(g))
        assert f"func.func @{g.name}_driver" in text
        proc = subprocess.run([MLIR_OPT, "-", "-o", "/dev/null"], input=text, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"{name}: {proc.stderr}\n{text}"
