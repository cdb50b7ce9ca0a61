"""The machine code of a fused elementwise kernel, as `as_text("asm")` shows it: its loops
use the vector registers of the loop width chosen for the host (each width it can run,
forced by the `loop_vector_register` fixture) and the vector loops call nothing (the
transcendentals are inline polynomials, not libm calls)."""
import re

import numpy as np

import tracecomp as tc


def _loops(asm: str) -> list[str]:
    """The text of every loop: from a label to a later jump back to it."""
    lines = asm.splitlines()
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\.?[\w.$]+):", line)
        if m:
            labels[m.group(1)] = i
            continue
        m = re.match(r"^\s+j\w+\s+(\.?[\w.$]+)\s*$", line)
        if m and m.group(1) in labels:
            loops.append("\n".join(lines[labels[m.group(1)]:i + 1]))
    return loops


def test_elementwise_loop_uses_the_chosen_vectors_and_calls_nothing(loop_vector_register):
    reg = loop_vector_register
    f = tc.trace(lambda x: x * tc.sigmoid(1.702 * x) + 0.5 * tc.sin(x) * tc.exp(-x * x))
    asm = f.lower(np.ones(1 << 16, np.float32)).as_text("asm")
    loops = _loops(asm)
    assert loops, "no loop found in the kernel's assembly"
    vector_loops = [body for body in loops if re.search(rf"v\w+\s.*%{reg}\d", body)]
    assert vector_loops, f"no loop computes on {reg} registers"
    for body in vector_loops:      # (a parallel chunk loop may call the outlined loop per chunk)
        assert not re.search(r"^\s+call", body, re.M), f"a call inside a vector loop:\n{body}"


def test_loop_finder_sees_calls():
    asm = ".LBB0_1:\n\tvaddps %zmm0, %zmm1, %zmm2\n\tcall expf\n\tjne .LBB0_1\n"
    assert _loops(asm) == [asm.rstrip("\n")]
    assert re.search(r"^\s+call", _loops(asm)[0], re.M)
