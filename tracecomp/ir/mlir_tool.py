"""Locate LLVM's `mlir-opt` and use it as an outside check that IR text is valid MLIR.

tracecomp never needs mlir-opt to compile; tests and the CLI use it to confirm that
every dump parses with `--allow-unregistered-dialect`. find_mlir_opt prefers the
LLVM 22 install, then whatever `mlir-opt` is on PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from ..core.errors import IRError

KNOWN_LOCATIONS = ("/usr/lib/llvm-22/bin/mlir-opt",)


def find_mlir_opt() -> str | None:
    """The path of an executable mlir-opt, or None if there is none."""
    for path in KNOWN_LOCATIONS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("mlir-opt")


def check_with_mlir_opt(text: str, filename: str = "<ir>", timeout: float = 60.0) -> None:
    """Run `mlir-opt --allow-unregistered-dialect` on `text`; raise IRError if it rejects it.

    The error message is mlir-opt's own diagnostics, with the temporary file's path
    replaced by `filename`.
    """
    tool = find_mlir_opt()
    if tool is None:
        raise IRError("mlir-opt not found (looked in "
                      f"{', '.join(KNOWN_LOCATIONS)} and on PATH); install LLVM's MLIR tools")
    with tempfile.TemporaryDirectory(prefix="tracecomp-mlir-") as tmp:
        path = os.path.join(tmp, "input.mlir")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        proc = subprocess.run([tool, "--allow-unregistered-dialect", path, "-o", os.devnull],
                              capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        diagnostics = proc.stderr.replace(path, filename).strip()
        raise IRError(f"mlir-opt rejected the IR (exit code {proc.returncode}):\n{diagnostics}")
