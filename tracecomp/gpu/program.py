"""A scheduled Program compiled for a CUDA architecture: PTX text plus the launches that
run it, in order (a GpuModule).  Building one needs llvmlite only: no GPU, no driver.

The module is generated once per (program, architecture): launch planning (launch.py),
code generation (nvptx_codegen.py), LLVM's O3 pipeline for the NVPTX target, and PTX
printing.  `describe()` is the JSON-ready description the exporter writes and the CLI
prints: per launch its entry point, kind, block, grid, static shared memory and
parameters; per buffer its role, dtype and shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ..lower.schedule import Program
from . import nvptx_target as T
from .launch import Launch, plan_kernel
from .nvptx_codegen import emit_launch


@dataclass
class GpuModule:
    program: Program
    arch: str
    launches: list[Launch]
    llvm_ir: str              # before optimization
    ptx: str

    def describe(self) -> dict:
        p = self.program
        buffers = {name: {"role": b.role, "dtype": b.dtype.label, "shape": list(b.shape)}
                   for name, b in p.buffers.items()}
        for launch in self.launches:
            for w in launch.workspaces:
                buffers[w.name] = {"role": "workspace", "dtype": w.dtype.label, "shape": [w.elements]}
        return {
            "name": p.name, "arch": self.arch, "ptx_isa": T.ptx_isa(self.arch),
            "inputs": list(p.inputs), "outputs": list(p.outputs), "buffers": buffers,
            "launches": [{"entry": l.name, "kernel": l.kernel.name, "kind": l.kind,
                          "block": list(l.block), "grid": list(l.grid),
                          "shared_bytes": l.shared_bytes, "params": l.params} for l in self.launches],
        }


def compile_program(program: Program, arch: str = T.DEFAULT_ARCH) -> GpuModule:
    """PTX for every kernel of `program` and the launches that run them."""
    T.check_arch(arch)
    module = ir.Module(name=f"tc_{program.name}_{arch}")
    module.triple = T.TRIPLE
    module.data_layout = T.data_layout(arch)
    launches = [launch for k in program.kernels for launch in plan_kernel(k)]
    for launch in launches:
        emit_launch(module, launch)
    text = str(module)
    ptx = T.emit_ptx(T.optimized_module(text, arch, module.name), arch)
    return GpuModule(program, arch, launches, text, ptx)

