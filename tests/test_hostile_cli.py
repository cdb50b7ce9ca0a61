"""The `tracecomp` CLI given hostile input specs (issue 33, item 9): zero-size inputs whose
other dims are huge.  NumPy accepts a zero-size array with any dims whose byte strides fit
64 bits; the CLI takes those, and refuses the others with one line naming the spec, never
a traceback."""
from __future__ import annotations

import pytest

from test_cli import run, workdir  # noqa: F401  (fixture)

MODULE = "import tracecomp as tc\n\ndef f(x):\n    return x.sum(dim=0) * 2 + x.mean()\n"


@pytest.fixture
def zero_dir(tmp_path):
    (tmp_path / "zeros.py").write_text(MODULE)
    return tmp_path


@pytest.mark.parametrize("spec", [
    "float32[0,99999999999999999999999]",      # a dim past int64
    "f32[0,9223372036854775807]",              # int64's largest: strides of 4 bytes overflow
    "f32[0,99999999999999,99999999999999]",    # two dims whose product overflows
    "f64[3,0,2305843009213693951]",
    "f32[0,1152921504606846976]",              # fits int64, but not NumPy's own limit
])
def test_a_zero_size_input_with_a_huge_dim_is_one_line(zero_dir, spec):
    for command in (["dump", "zeros:f", "--input", spec, "--stage", "loops"],
                    ["export", "zeros:f", "--input", spec, "-o", "z.so"]):
        proc = run(zero_dir, *command, ok=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"tracecomp: error: bad input spec {spec!r}"), lines


@pytest.mark.parametrize("spec", ["float32[0,99999999999999]", "f32[99999999999999,0]", "f32[0,0,99999999999999]"])
def test_a_zero_size_input_whose_strides_fit_compiles(zero_dir, spec):
    out = run(zero_dir, "dump", "zeros:f", "--input", spec, "--stage", "asm").stdout
    assert ".text" in out or "ret" in out
