"""The NVPTX target: triple, target machines per GPU architecture, and LLVM IR -> PTX text.

Each architecture is paired with the first PTX ISA version that supports it (sm_80 needs
PTX 7.0, sm_90 PTX 7.8, ...), so the PTX loads on the oldest driver that knows the GPU.
Target machines are cached per architecture; the O3 pipeline and assembly printing reuse
runtime/target.py's helpers (which hold LLVM_LOCK), so the module's triple and data
layout are the NVPTX ones when the optimizer runs.
"""
from __future__ import annotations

import functools
import threading

import llvmlite.binding as llvm

from ...core.errors import ArgumentError

TRIPLE = "nvptx64-nvidia-cuda"
DEFAULT_ARCH = "sm_80"
PTX_ISA = {"sm_80": (7, 0), "sm_86": (7, 1), "sm_87": (7, 4), "sm_89": (7, 8), "sm_90": (7, 8),
           "sm_90a": (8, 0), "sm_100": (8, 6), "sm_120": (8, 7)}
_INIT = threading.Lock()
_initialized = False


def initialize() -> None:
    """Register every LLVM target llvmlite was built with (NVPTX among them), once."""
    global _initialized
    with _INIT:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def check_arch(arch: str) -> str:
    if arch not in PTX_ISA:
        raise ArgumentError(f"unknown CUDA architecture {arch!r}; known: {', '.join(PTX_ISA)}")
    return arch


def ptx_isa(arch: str) -> str:
    """The PTX ISA version emitted for `arch`, e.g. '7.8'."""
    major, minor = PTX_ISA[check_arch(arch)]
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=None)
def target_machine(arch: str = DEFAULT_ARCH) -> llvm.TargetMachine:
    initialize()
    major, minor = PTX_ISA[check_arch(arch)]
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=arch, features=f"+ptx{major}{minor}", opt=3)


def data_layout(arch: str = DEFAULT_ARCH) -> str:
    return str(target_machine(arch).target_data)


def optimized_module(llvm_ir: str, arch: str = DEFAULT_ARCH, name: str = "<tracecomp-ptx>") -> llvm.ModuleRef:
    """Parse, verify and run LLVM's O3 pipeline for `arch` over the module text."""
    from ..llvm import target as host
    initialize()
    tm = target_machine(arch)
    module_ref = host.parse(llvm_ir, name)
    return host.optimize(module_ref, tm)


def emit_ptx(module_ref: llvm.ModuleRef, arch: str = DEFAULT_ARCH) -> str:
    from ..llvm import target as host
    return host.emit_assembly(module_ref, target_machine(arch))
