"""The installed package is complete: tables inside it, console script, version."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tracecomp
from tracecomp.ops.table import table_path


def test_tables_ship_inside_the_package():
    pkg = Path(tracecomp.__file__).resolve().parent
    if os.environ.get("TRACECOMP_TEST_INSTALLED"):
        assert "site-packages" in str(pkg), f"tests imported the source tree: {pkg}"
        assert (pkg / "ops.yaml").exists() and (pkg / "derivatives.yaml").exists()
    assert table_path().exists()


def _cli() -> list[str]:
    script = shutil.which("tracecomp")
    if os.environ.get("TRACECOMP_TEST_INSTALLED"):
        assert script, "the tracecomp console script is not installed"
    return [script] if script else [sys.executable, "-m", "tracecomp.cli"]


def test_console_script_version_and_help():
    out = subprocess.run(_cli() + ["--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"tracecomp {tracecomp.__version__}"
    helptext = subprocess.run(_cli() + ["--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: tracecomp" in helptext
