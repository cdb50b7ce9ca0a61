"""An exported library with bfloat16 and float16 buffers: the header names their bits'
dtype beside uint16_t, the library needs no conversion routine from a runtime library
(__truncsfbf2, __extendhfsf2), and tc.load runs it bit for bit as tc.trace does."""
import re
import subprocess

import numpy as np
import pytest

import tracecomp as tc


def fn(a, b):
    return (a * 1.5 + b.float()).exp().bfloat16(), (b - 1).half()


def test_half_buffers_in_the_header_and_loaded_back(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 5)).astype(np.float32).astype(tc.bfloat16.np)
    b = rng.standard_normal((4, 5)).astype(np.float16)
    path = tmp_path / "libhalf.so"
    tc.export(fn, (a, b), str(path))
    header = (tmp_path / "libhalf.h").read_text()
    assert re.search(r"inputs\[0\]: bfloat16\[4, 5\]  -> uint16_t\[20\], 40 bytes .*bfloat16 bits", header)
    assert re.search(r"inputs\[1\]: float16\[4, 5\]  -> uint16_t\[20\], 40 bytes .*float16 bits", header)
    loaded, traced = tc.load(str(path))(a, b), tc.trace(fn)(a, b)
    for got, want in zip(loaded, traced):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    try:
        symbols = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        pytest.skip("nm is not installed")
    assert not re.search(r"__(trunc|extend)\w*(hf|bf)", symbols), symbols
