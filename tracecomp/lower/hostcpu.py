"""The CPU code is generated for, as facts: LLVM's triple, name and features for it, its
model name, its caches, and the choices measured on it.  Facts only, no code generation:
the scheduler's tiles (lower/schedule/tiles.py) are derived from them, the runtime's target
machines (runtime/target.py) are built from them, and `tracecomp info` prints them.  The
measured choices (`tuned()`) are what a model of the CPU cannot decide; runtime/tuning.py
measures them once per CPU and installs them before any program is scheduled.

`TRACECOMP_TARGET` picks another target on a host that has more, to test and measure it on
any machine: `avx2` generates code as for an AVX2 CPU (AVX-512 and AMX off), `rocketlake`
as LLVM generates it for Intel's Rocket Lake (AVX-512, with the CPU model that tunes
elementwise loops for 256-bit vectors), so an AMD host runs the code an Intel host would
get.  Features can only be turned off, never on (that would run instructions the CPU
lacks), so every target runs on this host.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import llvmlite.binding as llvm

from ..core.errors import BackendError

TARGET_ENV = "TRACECOMP_TARGET"


@dataclass(frozen=True)
class NarrowerTarget:
    off: tuple[str, ...] = ()          # feature-name prefixes turned off
    needs: tuple[str, ...] = ()        # features the host must have
    cpu: str | None = None             # LLVM's CPU model to tune for (None: the host's)


NARROWER_TARGETS = {
    "host": NarrowerTarget(),
    "avx2": NarrowerTarget(off=("avx512", "amx", "avx10", "evex512"), needs=("avx2",)),
    # Rocket Lake's AVX-512 subset: what Zen 4/5 or Sapphire Rapids have beyond it goes off
    "rocketlake": NarrowerTarget(off=("amx", "avx10", "avx512fp16", "avx512bf16", "avx512vp2intersect"),
                                 needs=("avx512f", "avx512bw", "avx512dq", "avx512vl"), cpu="rocketlake"),
}
SYSFS_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class HostTarget:
    triple: str
    cpu: str
    features: str     # "+avx2,+avx512f,-amx-tile,..." as LLVM's subtarget feature string

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")


def host_target() -> HostTarget:
    """The process's triple and the host CPU's name and features as LLVM reports them,
    narrowed by TRACECOMP_TARGET, with the measured vector width of the loop vectorizer
    (`tuned()["loop_vector_bytes"]`) as LLVM's prefer-256-bit tuning feature: the CPU model
    alone decides that width otherwise (rocketlake: 256 bits, Zen: 512)."""
    loop_bytes = _tuned.get("loop_vector_bytes")
    return _preferring(detected_target(), loop_bytes) if loop_bytes else detected_target()


@functools.lru_cache(maxsize=None)
def _preferring(target: HostTarget, loop_bytes: int) -> HostTarget:
    sign = "+" if loop_bytes < 64 else "-"
    return replace(target, features=f"{target.features},{sign}prefer-256-bit")


@functools.lru_cache(maxsize=None)
def detected_target() -> HostTarget:
    """The target before the measured choices: what they are measured for (their key)."""
    features = llvm.get_host_cpu_features()
    choice = target_name()
    if choice not in NARROWER_TARGETS:
        raise BackendError(f"{TARGET_ENV}={choice!r} is not a target tracecomp knows (one of "
                           f"{', '.join(NARROWER_TARGETS)})")
    narrower = NARROWER_TARGETS[choice]
    missing = [name for name in narrower.needs if not features.get(name)]
    if missing:
        raise BackendError(f"{TARGET_ENV}={choice}, but this CPU has no {', '.join(missing)}")
    for name in features:
        if name.startswith(narrower.off):
            features[name] = False
    return HostTarget(llvm.get_process_triple(), narrower.cpu or llvm.get_host_cpu_name(), features.flatten())


def target_name() -> str:
    return os.environ.get(TARGET_ENV, "host")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def caches() -> list[dict]:
    """Per cache of the first CPU: level, type, size in bytes, CPUs sharing it (sysfs)."""
    out = []
    for index in sorted(SYSFS_CACHES.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _bytes((index / "size").read_text().strip())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        out.append({"level": level, "type": kind, "bytes": size, "shared_by_cpus": shared})
    return out


def cache_bytes(level: int) -> int | None:
    """The size of the first CPU's data (or unified) cache at `level`; None if unknown."""
    return next((c["bytes"] for c in caches() if c["level"] == level and c["type"] != "Instruction"), None)


def _bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


_tuned: dict = {}


def tuned() -> dict:
    """The choices measured on this CPU (runtime/tuning.py), e.g. {"matmul_vector_bytes": 64,
    "loop_vector_bytes": 64}; empty when nothing was measured (the models decide alone)."""
    return dict(_tuned)


def set_tuned(choices: dict) -> None:
    _tuned.clear()
    _tuned.update(choices)


_tile_data = [False]


def tile_data_granted() -> bool:
    """Whether Linux granted this process the AMX tile data state (runtime/amx.py asks,
    runtime/tuning.py records the answer before anything is scheduled): without it the
    first tile instruction faults, so the AMX matmul paths need it."""
    return _tile_data[0]


def set_tile_data_granted(granted: bool) -> None:
    _tile_data[0] = bool(granted)
