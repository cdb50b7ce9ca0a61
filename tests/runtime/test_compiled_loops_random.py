"""Random scans (yields that are block arguments, repeated or computed; consts shared with
init; reversed; lengths 0-3; a scan nested in the body) compiled and run by the loop-IR
interpreter against the graph interpreter."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from tracecomp.lower.loops.interp import run_program
from tracecomp.lower.schedule.scheduler import schedule
from tracecomp.runtime.compiled import CompiledProgram
from tracecomp.runtime.interpreter import run_graph

from lower import region_graphs as RG

S = RG.T((2, 3))
MIXES = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "tanh": lambda a, b: (a * b).tanh(),
         "max": lambda a, b: a.maximum(b) * 0.5}


def yields(draw, args: int, count: int):
    arg = st.tuples(st.just("arg"), st.integers(0, args - 1))
    mix = st.tuples(st.sampled_from(sorted(MIXES)), st.integers(0, args - 1), st.integers(0, args - 1))
    return [draw(st.one_of(arg, mix)) for _ in range(count)]


def body_of(spec, args: int, nested=None):
    def fn(*xs):
        out = [xs[a[1]] if a[0] == "arg" else MIXES[a[0]](xs[a[1]], xs[a[2]]) for a in spec]
        return tuple(out) if len(out) > 1 else out[0]
    g = RG.region(fn, *[S] * args)
    if nested is None:
        return g
    # a scan over the first yield, three steps of `nested`, whose result replaces it
    inner = RG.region(lambda c: (c * 0.5 + 1).tanh(), S)
    c, = RG.scan(g, inner, [], [g.outputs[0]], [], nested)[:1]
    g.outputs = [c] + g.outputs[1:]
    return g


@st.composite
def scans(draw):
    consts, carry, xs, ys = (draw(st.integers(lo, 2)) for lo in (0, 1, 0, 0))
    length, reverse = draw(st.integers(0, 3)), draw(st.booleans())
    args = consts + carry + xs
    body = body_of(yields(draw, args, carry + ys), args, draw(st.sampled_from([None, 0, 2])))
    g = RG.Graph("main", [S] * (consts + carry) + [RG.T((length, 2, 3))] * xs)
    operands = list(g.inputs)
    if consts and draw(st.booleans()):
        operands[consts] = operands[0]           # the first carry starts from the first const
    g.outputs = list(RG.scan(g, body, operands[:consts], operands[consts:consts + carry],
                             operands[consts + carry:], length, reverse))
    extra = draw(st.sampled_from(["none", "input", "twice"]))
    if extra == "input":
        g.outputs.append(g.inputs[0])
    elif extra == "twice":
        g.outputs.append(g.outputs[0])
    return RG.checked(g), draw(st.integers(0, 2 ** 16))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scans())
def test_random_scans(case):
    g, seed = case
    ins = RG.inputs_for(g, seed)
    want = run_graph(g, ins)
    program = schedule(g)
    RG.assert_close(run_program(program, ins), want)
    RG.assert_close(CompiledProgram(program)(ins), want)
