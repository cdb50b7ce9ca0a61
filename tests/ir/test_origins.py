"""Op origins: every op of the optimized graph says where it came from (its user's line,
forward or backward, and the op it was derived from), through every pass, in the text
form and in the CLI's dumps and pictures."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

import tracecomp as tc
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.printer import print_graph
from tracecomp.transforms.pipeline import pipeline

from test_cli import cli

THIS_FILE = os.path.relpath(__file__)


def mlp_loss(w1, b1, w2, x):
    h = tc.relu(x @ w1 + b1)                          # line of the forward ops
    return tc.log_softmax(h @ w2, dim=1).mean()


MLP_LINES = {mlp_loss.__code__.co_firstlineno + 1, mlp_loss.__code__.co_firstlineno + 2}


def mlp_inputs():
    r = np.random.default_rng(0)
    return [r.standard_normal(s).astype(np.float32) for s in [(6, 5), (5,), (5, 3), (4, 6)]]


def test_every_op_after_every_pass_points_at_the_users_line():
    lowered = tc.trace(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2))).lower(*mlp_inputs())
    manager = pipeline(record=True)
    manager.run(lowered.graph)
    assert list(manager.texts) == ["input"] + manager.names
    for stage, text in manager.texts.items():
        graph = parse_graph(text)
        for op in graph.ops:
            assert op.loc is not None, (stage, op)
            assert (op.loc.file, op.loc.line) in {(THIS_FILE, n) for n in MLP_LINES}, (stage, op, op.loc)
    phases = {op.loc.phase for op in lowered.optimized.ops}
    assert phases == {"forward", "backward"}
    sources = {op.loc.source for op in lowered.optimized.ops if op.loc.is_backward}
    assert {"tc.matmul", "tc.relu"} <= sources       # the forward ops they differentiate
    # the composite's pieces name it (log_softmax decomposes into amax, sub, exp, ...)
    assert any(op.loc.source == "tc.log_softmax" and not op.loc.is_backward for op in lowered.optimized.ops)


def test_the_backward_phase_is_what_the_loss_does_not_need():
    lowered = tc.trace(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2))).lower(*mlp_inputs())
    graph = lowered.graph
    forward, stack = set(), [v.op for v in graph.outputs[:1] if v.op is not None]
    while stack:
        op = stack.pop()
        if op not in forward:
            forward.add(op)
            stack.extend(v.op for v in op.operands if v.op is not None)
    for op in graph.ops:
        assert op.loc.is_backward == (op not in forward), op
    assert lowered.backward_ops == {op for op in graph.ops if op not in forward}


def test_golden_text():
    def f(x):
        return tc.tanh(x).sum()
    line = f.__code__.co_firstlineno + 1
    lowered = tc.trace(tc.grad(f)).lower(np.ones(3, np.float32))
    here = f'"{THIS_FILE}":{line}:0'
    assert print_graph(lowered.optimized) + "\n" == textwrap.dedent(f"""\
        func.func @grad_f(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {{
          %0 = "tc.tanh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32> loc({here})
          %1 = "tc.mul"(%0, %0) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32> loc("backward:tc.tanh"({here}))
          %2 = "tc.sub"(%1) {{self = 1 : i64, alpha = 1 : i64}} : (tensor<3xf32>) -> tensor<3xf32> loc("backward:tc.tanh"({here}))
          return %2 : tensor<3xf32>
        }}
        """)


MODEL = textwrap.dedent("""\
    import tracecomp as tc


    def loss(q, k, v):
        s = q @ k.T / 4.0
        p = tc.softmax(s, dim=1)
        o = p @ v
        return (o * o).sum() + (q * q).sum()
    """)


def test_cli_dump_points_backward_ops_at_the_users_file(tmp_path):
    (tmp_path / "attn.py").write_text(MODEL)
    spec = ["--input", "f32[4,8]"] * 3
    proc = subprocess.run(cli() + ["dump", "attn:loss", *spec, "--grad", "0", "--stage", "optimized"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    graph = parse_graph(proc.stdout)
    assert graph.ops
    for op in graph.ops:
        assert op.loc is not None and op.loc.file == "attn.py" and 5 <= op.loc.line <= 8, (op, op.loc)
    assert any(op.loc.is_backward and op.name == "tc.add" for op in graph.ops)
