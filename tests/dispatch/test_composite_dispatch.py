"""Composite ops in the dispatcher: every dispatch key, the tracer's too, sees the ops of a
composite's program, which runs once per call; the decompose pass is left for composite ops
in graphs parsed from text."""
from __future__ import annotations

import numpy as np

import tracecomp as tc
from tracecomp.ir.parser import parse_graph
from tracecomp.ops import formula
from tracecomp.ops.table import default_table
from tracecomp.runtime.interpreter import run_graph
from tracecomp.transforms.decompose import decompose

SOFTMAX = default_table()["softmax"]
PIECES = ["tc.amax", "tc.sub", "tc.exp", "tc.sum", "tc.div"]
X = np.arange(6, dtype=np.float32).reshape(2, 3)
WANT = np.exp(X - X.max(1, keepdims=True)) / np.exp(X - X.max(1, keepdims=True)).sum(1, keepdims=True)


def test_a_traced_composite_runs_its_program_once(monkeypatch):
    runs = []
    run_program = formula.Evaluator.run_program

    def counted(self, program):
        runs.append(program)
        return run_program(self, program)
    monkeypatch.setattr(formula.Evaluator, "run_program", counted)
    lowered = tc.trace(lambda x: tc.softmax(x, 1)).lower(X)      # traced, then optimized
    assert runs.count(SOFTMAX.program) == 1
    np.testing.assert_allclose(run_graph(lowered.optimized, [X])[0], WANT, rtol=1e-6)


def test_the_trace_records_a_composites_pieces_where_it_was_called():
    def f(x):
        return tc.softmax(x, 1) * 2
    line = f.__code__.co_firstlineno + 1
    graph = tc.trace(f).lower(X).graph
    assert [op.name for op in graph.ops if op.loc.source == "tc.softmax"] == PIECES
    assert [op.name for op in graph.ops if op.loc.source is None] == ["tc.mul"]
    assert {(op.loc.line, op.loc.phase) for op in graph.ops} == {(line, "forward")}


def test_decompose_splits_a_composite_read_from_text():
    graph = parse_graph("""
        func.func @f(%arg0: tensor<2x3xf32>) -> (tensor<2x3xf32>) {
          %0 = "tc.softmax"(%arg0) {dim = 1 : i64, dtype} : (tensor<2x3xf32>) -> tensor<2x3xf32> loc("m.py":3:0)
          return %0 : tensor<2x3xf32>
        }""")
    new = decompose(graph)
    assert [op.name for op in new.ops] == PIECES
    assert {(op.loc.file, op.loc.line, op.loc.source) for op in new.ops} == {("m.py", 3, "tc.softmax")}
    np.testing.assert_allclose(run_graph(new, [X])[0], WANT, rtol=1e-6)
