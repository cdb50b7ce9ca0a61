"""tracecomp imported before NumPy shortens the spin of NumPy's idle OpenBLAS threads
(numpy_blas.py), for NumPy's loading only; imported after NumPy, or with the user's own
OPENBLAS_THREAD_TIMEOUT, it leaves OpenBLAS as it is, and `tracecomp info` says which."""
import os
import subprocess
import sys

import pytest

from tracecomp import numpy_blas

if numpy_blas.openblas_spin() is None:
    pytest.skip("NumPy's BLAS here is not an OpenBLAS that reports its spin", allow_module_level=True)

READ = ("import os, tracecomp.numpy_blas as b\n"
        "print(b.openblas_spin(), os.environ.get('OPENBLAS_THREAD_TIMEOUT'), '|', b.describe())\n")


def run(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_imported_first_it_shortens_the_spin_for_numpys_loading_only():
    out = run("import tracecomp\n" + READ)
    assert out.startswith(f"{numpy_blas.SHORT_SPIN} None |") and "set by tracecomp" in out


def test_imported_after_numpy_it_changes_nothing_and_says_so():
    out = run("import numpy, tracecomp\n" + READ)
    assert out.startswith(f"{numpy_blas.DEFAULT_SPIN} None |") and "NumPy was loaded before tracecomp" in out


def test_the_users_setting_wins():
    out = run("import tracecomp\n" + READ, OPENBLAS_THREAD_TIMEOUT="20")
    assert out.startswith("20 20 |") and "set by the user" in out
