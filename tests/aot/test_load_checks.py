"""tc.load checks a library before dlopen (issue 19, item 6): a truncated library that keeps
its ELF headers used to be mapped and kill Python with SIGBUS; a damaged one, or one that
is not tracecomp's, must be a clear error.  Each case runs in a child process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tracecomp as tc

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="tc.export needs a C compiler to link")

CHILD = """
import sys
import tracecomp as tc
try:
    tc.load(sys.argv[1], name=sys.argv[2] if len(sys.argv) > 2 else None)
except tc.TracecompError as e:
    print(type(e).__name__, e)
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lib") / "libdbl.so")
    tc.export(lambda x: (x * 2.0).exp(), [np.arange(3, dtype=np.float32)], path)
    return path


def load_in_child(path, *name):
    r = subprocess.run([sys.executable, "-c", CHILD, path, *name], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"the child died ({r.returncode}): {r.stderr}"
    return r.stdout


def copy(library, tmp_path, data: bytes, with_checksum=False) -> str:
    path = str(tmp_path / "libdbl.so")
    with open(path, "wb") as f:
        f.write(data)
    if with_checksum:
        shutil.copy(library + ".sha256", path + ".sha256")
    return path


def test_export_writes_a_checksum_that_load_accepts(library):
    digest, name = open(library + ".sha256").read().split()
    assert name == "libdbl.so" and len(digest) == 64
    out = tc.load(library)(np.arange(3, dtype=np.float32))
    np.testing.assert_allclose(np.asarray(out), np.exp(2.0 * np.arange(3)), rtol=1e-6)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_a_truncated_library_is_refused_not_mapped(library, tmp_path, keep):
    data = open(library, "rb").read()
    path = copy(library, tmp_path, data[:int(len(data) * keep)])
    out = load_in_child(path, "dbl")
    assert out.startswith("BackendError") and "past the end" in out


def test_a_changed_library_fails_its_checksum(library, tmp_path):
    data = bytearray(open(library, "rb").read())
    data[len(data) // 2] ^= 0x40
    out = load_in_child(copy(library, tmp_path, bytes(data), with_checksum=True), "dbl")
    assert out.startswith("BackendError") and "does not match its checksum" in out


@pytest.mark.parametrize("data, message", [(b"not an elf file at all", "not an ELF file"),
                                           (b"\x7fELF" + bytes(60), "not a 64-bit little-endian")])
def test_other_files_are_refused(library, tmp_path, data, message):
    out = load_in_child(copy(library, tmp_path, data), "dbl")
    assert out.startswith("BackendError") and message in out


def test_a_library_without_the_metadata_symbol_is_refused(library, tmp_path):
    out = load_in_child(copy(library, tmp_path, open(library, "rb").read()), "other")
    assert "does not define 'other_metadata'" in out
