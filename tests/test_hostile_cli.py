"""The `tracecomp` CLI given hostile input (issue 33, item 9): zero-size inputs whose other
dims are huge (NumPy accepts a zero-size array with any dims whose byte strides fit 64 bits;
the CLI takes those, and refuses the others with one line naming the spec), malformed
specs, and module paths that are not modules.  Every refusal is one line, never a traceback."""
from __future__ import annotations

import os

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


def one_line_error(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracecomp: error: "), lines
    return lines[0]


@pytest.mark.parametrize("spec", ["f32[-1,3]", "f33[2]", "f32[2", "f32[a]", "f32[2]x", "[2]", "f32[2,,3]",
                                  "f32[" + ",".join(["2"] * 65) + "]", "f32[99999999999]"])
def test_a_malformed_or_huge_spec_is_one_line_naming_it(zero_dir, spec):
    line = one_line_error(run(zero_dir, "dump", "zeros:f", "--input", spec, ok=False))
    assert f"bad input spec {spec!r}" in line


def test_a_module_path_that_is_a_fifo_or_a_folder_is_named_without_blocking(zero_dir):
    os.mkfifo(zero_dir / "pipe.py")
    (zero_dir / "folder.py").mkdir()
    for name in ("pipe.py", "folder.py"):
        line = one_line_error(run(zero_dir, "dump", f"{name}:f", "--input", "f32[2]", ok=False))
        assert line.endswith(f"not a regular file: {name}"), line
    line = one_line_error(run(zero_dir, "dump", "missing.py:f", "--input", "f32[2]", ok=False))
    assert line.endswith("no such file: missing.py"), line


@pytest.mark.parametrize("source, needle", [
    ('raise RuntimeError("boom at import")\n', "RuntimeError: boom at import"),
    ("def f(x):\n    return x.nonexistent()\n", "AttributeError"),
    ("f = 3\n", "is not callable"),
    ("def f(x):\n    return float(x.sum())\n", "bad.py"),           # a TraceError names the line
])
def test_a_module_that_fails_is_one_line_naming_why(zero_dir, source, needle):
    (zero_dir / "bad.py").write_text(source)
    line = one_line_error(run(zero_dir, "dump", "bad.py:f", "--input", "f32[2]", ok=False))
    assert needle in line, line
