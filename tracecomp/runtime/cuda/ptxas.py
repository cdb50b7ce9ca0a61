"""NVIDIA's PTX assembler as an outside check of the PTX we emit, and its -v figures.

`assemble(ptx, arch)` runs `ptxas -v -arch=ARCH` on the text (ptxas is CUDA's own
assembler: if it accepts the PTX, the driver's JIT will too) and returns, per entry
point, the registers, spills, stack frame, shared memory and barriers it reports.  A
rejected module raises BackendError with ptxas's diagnostics.  tracecomp never needs
ptxas to run (the driver compiles PTX itself); tests and the CLI use it when present.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ...core.errors import BackendError

KNOWN_LOCATIONS = ("/usr/local/bin/ptxas", "/usr/local/cuda/bin/ptxas")


def find_ptxas() -> str | None:
    """The path of an executable ptxas, or None if there is none."""
    for path in KNOWN_LOCATIONS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("ptxas")


@dataclass(frozen=True)
class EntryFigures:
    """What `ptxas -v` reports for one entry point."""
    entry: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    barriers: int

    def summary(self) -> str:
        return (f"{self.registers} registers, {self.spill_stores} bytes spill stores, "
                f"{self.spill_loads} bytes spill loads, {self.stack_bytes} bytes stack, "
                f"{self.shared_bytes} bytes smem, {self.barriers} barriers ({self.arch})")


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_verbose(text: str) -> dict[str, EntryFigures]:
    """The per-entry figures from ptxas -v output."""
    out: dict[str, EntryFigures] = {}
    entry = arch = None
    frame = (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            entry, arch, frame = m.group(1), m.group(2), (0, 0, 0)
        elif (m := _FRAME.search(line)) and entry:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry:
            smem, bars = _SMEM.search(line), _BARRIERS.search(line)
            out[entry] = EntryFigures(entry, arch, int(m.group(1)), frame[1], frame[2], frame[0],
                                      int(smem.group(1)) if smem else 0, int(bars.group(1)) if bars else 0)
            entry = None
    return out


def assemble(ptx: str, arch: str, timeout: float = 300.0) -> dict[str, EntryFigures]:
    """Assemble `ptx` for `arch` with ptxas -v; the figures of every entry point."""
    tool = find_ptxas()
    if tool is None:
        raise BackendError(f"ptxas not found (looked in {', '.join(KNOWN_LOCATIONS)} and on PATH); "
                           "install the CUDA toolkit's ptxas to check PTX")
    with tempfile.TemporaryDirectory(prefix="tracecomp-ptx-") as tmp:
        path = os.path.join(tmp, "module.ptx")
        with open(path, "w", encoding="utf-8") as f:
            f.write(ptx)
        proc = subprocess.run([tool, "-v", f"-arch={arch}", path, "-o", os.path.join(tmp, "module.cubin")],
                              capture_output=True, text=True, timeout=timeout)
    output = (proc.stdout + proc.stderr).replace(path, "<ptx>")
    if proc.returncode != 0:
        errors = "\n".join(line for line in output.splitlines() if "info" not in line)
        raise BackendError(f"ptxas -arch={arch} rejected the PTX (exit code {proc.returncode}):\n{errors.strip()}")
    return parse_verbose(output)
