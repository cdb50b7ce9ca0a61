"""Kernels lead back to the user's code: names with the source line, the graph ops each
kernel computes (Program.kernel_ops), and comments in the loop IR, LLVM IR and assembly."""
from __future__ import annotations

import re

import numpy as np

import tracecomp as tc
from tracecomp.core.locations import Location
from tracecomp.lower.schedule.nests import kernel_name, short_location

HERE = "test_kernel_name_py"      # the file stem, cut to 16 characters


def _line_of(text: str) -> int:
    """The line of this file that contains `text`."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def mlp(x, w, b):
    h = tc.relu(x @ w + b)                       # line: relu
    return tc.softmax(h, 1)                       # line: softmax


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 32), np.float32),
            rng.standard_normal(32, np.float32))


def test_kernel_names_carry_the_source_line_and_are_identifiers():
    lowered = tc.trace(mlp).lower(*_inputs())
    names = [k.name for k in lowered.program.kernels]
    relu, softmax = _line_of("# line: relu"), _line_of("# line: softmax")
    assert names[0] == f"k1_{HERE}{relu}_matmul_add_relu"          # fused epilogue: consumer's number
    assert all(f"_{HERE}{softmax}_" in n for n in names[1:])
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) and len(n) < 64 for n in names)
    assert len(set(names)) == len(names)


def test_kernel_ops_record_every_graph_op_once_per_kernel_that_computes_it():
    lowered = tc.trace(mlp).lower(*_inputs())
    p = lowered.program
    assert list(p.kernel_ops) == [k.name for k in p.kernels]
    fused = p.kernel_ops[p.kernels[0].name]
    assert [op.name for op in fused] == ["tc.matmul", "tc.add", "tc.relu"]
    computed = {op for ops in p.kernel_ops.values() for op in ops}
    # every op of the optimized graph but constants is computed by some kernel
    assert computed == {op for op in lowered.optimized.ops if op.name != "tc.constant"}


def test_backward_kernels_carry_the_forward_line():
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    line = _line_of("# line" + ": tanh")    # not this line
    lowered = tc.trace(tc.grad(lambda x: tc.tanh(x).sum())).lower(x)    # line: tanh
    assert lowered.program.kernels and all(f"_{HERE}{line}_" in k.name for k in lowered.program.kernels)


def test_short_location_and_kernel_name_forms():
    x = np.ones(3, np.float32)
    op = tc.trace(lambda x: x + 1).lower(x).optimized.ops[-1]
    op.loc = Location("dir/my-model.v2.py", 7)
    assert short_location(op) == "my_model_v2_py7"
    op.loc = Location("<stdin>", 3)
    assert short_location(op) == "stdin_l3"
    op.loc = None
    assert short_location(op) == "" and kernel_name(5, [op]) == "k5_add"


def test_stages_show_the_source_of_each_kernel():
    lowered = tc.trace(mlp).lower(*_inputs())
    where = f"test_kernel_names.py:{_line_of('# line: softmax')}"
    for stage in ("loops", "llvm", "asm"):
        text = lowered.as_text(stage)
        for k in lowered.program.kernels:
            assert k.name in text, (stage, k.name)
        assert "tc.matmul" in text and where in text, stage
