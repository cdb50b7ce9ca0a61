"""Exported libraries with loops (issue 35): the loop is native code in the C entry point,
and a tc.fori_loop bound passed as an input is a run-time trip count."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import tracecomp as tc

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="tc.export links with the system C compiler; 'cc' is missing")


def powers(n, x):
    return tc.fori_loop(0, n, lambda i, v: v * 1.5 + i, x)


def smooth(c, a, xs):
    return tc.scan(lambda c, x: ((c * a + x).tanh(),) * 2, c, xs)


def interp(fn, *args):
    out = tc.trace(fn, backend="interp")(*args)
    return [np.asarray(t) for t in (out if isinstance(out, (tuple, list)) else [out])]


def results(out):
    return [np.asarray(t) for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.fixture(scope="module")
def powers_lib(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("loop") / "libpowers.so")
    tc.export(powers, [np.int64(3), np.ones(4, np.float32)], path)
    return path


def test_a_run_time_trip_count_from_python(powers_lib):
    f = tc.load(powers_lib)
    x = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    for n in (0, 1, 2, 7, 40):
        np.testing.assert_allclose(results(f(np.int64(n), x))[0], interp(powers, np.int64(n), x)[0], rtol=1e-6)


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "libpowers.h"

int main(int argc, char** argv) {
    int64_t n = atoll(argv[1]);
    float x[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    float out[4];
    const void* inputs[] = {&n, x};
    void* outputs[] = {out};
    int code = powers(inputs, outputs);
    if (code) { printf("error %d %s\n", code, powers_error_string(code)); return 1; }
    for (int i = 0; i < 4; i++) printf("%.9g ", out[i]);
    printf("\n");
    return 0;
}
"""


def test_a_run_time_trip_count_from_c(powers_lib, tmp_path):
    libdir = os.path.dirname(powers_lib)
    src = tmp_path / "main.c"
    src.write_text(C_PROGRAM)
    exe = tmp_path / "main"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c99", "-Wall", "-Werror", str(src), "-I", libdir,
                    "-L", libdir, "-lpowers", f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    x = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    for n in (0, 3, 25):
        run = subprocess.run([str(exe), str(n)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        got = np.array([float(v) for v in run.stdout.split()], np.float32)
        np.testing.assert_allclose(got, interp(powers, np.int64(n), x)[0], rtol=1e-6)


def test_an_exported_scan(tmp_path):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 8), (3, 8), (50, 3, 8))]
    path = str(tmp_path / "libsmooth.so")
    tc.export(smooth, args, path)
    got = results(tc.load(path)(*args))
    want = interp(smooth, *args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
