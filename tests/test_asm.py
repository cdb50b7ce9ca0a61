"""The machine code of a fused elementwise kernel, as `as_text("asm")` shows it: its loops
use the host's widest vector registers and the vector loops call nothing (the transcendentals are inline
polynomials, not libm calls)."""
import functools
import re

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime import target


@functools.cache
def _preferred_vector_register() -> str | None:
    """The vector registers the host's code generation prefers, read back from a probe: a
    plain elementwise loop, which every target vectorizes at its preferred width.  That is
    not always the ISA's widest: LLVM tunes Intel's rocketlake for 256-bit vectors although it
    has AVX-512, so a test expecting zmm there would test one CPU, not tracecomp."""
    asm = tc.trace(lambda x: x * 2.0 + 1.0).lower(np.ones(1 << 14, np.float32)).as_text("asm")
    return next((reg for reg in ("zmm", "ymm") if re.search(rf"%{reg}\d", asm)), None)


def _widest_vector_register() -> str:
    """The register class the generated loops must use: the target's preferred width (when
    the ISA has at least AVX)."""
    features = target.host_target().features.split(",")
    if not ("+avx512f" in features or "+avx2" in features or "+avx" in features):
        pytest.skip("host has neither AVX nor AVX-512 (no wide vector registers to look for)")
    reg = _preferred_vector_register()
    assert reg is not None, "the probe loop x * 2 + 1 was not vectorized with ymm or zmm registers"
    return reg


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


def test_elementwise_loop_uses_widest_vectors_and_calls_nothing():
    reg = _widest_vector_register()
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
