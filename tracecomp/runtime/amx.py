"""Linux's permission to use AMX tiles: a process must ask for the tile data state
(XFEATURE_XTILEDATA) with arch_prctl(ARCH_REQ_XCOMP_PERM) before its first tile
instruction, or that instruction faults (SIGILL).  `request_tile_data()` asks once per
process, before code with AMX kernels (llvm/gemm/amx.py) first runs: runtime/tuning.py asks
before anything is scheduled; an exported library with AMX kernels asks by itself when
it is loaded (llvm/gemm/amx.py: request_tiles_on_load), for tc.load as for a C program."""
from __future__ import annotations

import ctypes
import functools
import platform

from ..lower.llvm.gemm.amx import ARCH_REQ_XCOMP_PERM, SYS_ARCH_PRCTL, XFEATURE_XTILEDATA


@functools.lru_cache(maxsize=None)
def request_tile_data() -> bool:
    """Whether this process may use the AMX tile data (asked once): False off Linux x86-64
    and where the kernel or the CPU refuses (no AMX: EINVAL)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
