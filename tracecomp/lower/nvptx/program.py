"""A scheduled Program compiled for a CUDA architecture: PTX text plus the launches that
run it, in order (a GpuModule).  Building one needs llvmlite only: no GPU, no driver.

The module is generated once per (program, architecture): launch planning (launch.py),
code generation (codegen.py), LLVM's O3 pipeline for the NVPTX target, and PTX
printing.  `describe()` is the JSON-ready description the exporter writes and the CLI
prints: per launch its entry point, kind, block, grid, static shared memory and
parameters (and the host loops around it: hostloops.py); per buffer its role, dtype and
shape (dynamic dims and grids as text over the named sizes: grid.py); for a program with loops and branches,
its steps (loops/control.py's to_json), which say where each kernel's launches run (the
launches are listed in kernel order; the host runs the loops, as runtime/cuda/runner.py).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import llvmlite.ir as ir

from ...core.errors import BackendError
from ...core.symbolic import DynamicShapeError
from ..llvm.entry_sizes import public_name
from ..schedule.scheduler import Program
from . import target as T
from ..loops.control import to_json
from .grid import grid_json, size_text
from .hostloops import loops_json
from .launch import Launch, plan_kernel
from .kernels import emit_launch
from .attention import emit_attention, is_attention, plan_attention


@dataclass
class GpuModule:
    program: Program
    arch: str
    launches: list[Launch]
    llvm_ir: str              # before optimization
    ptx: str

    def describe(self) -> dict:
        p = self.program
        buffers = {name: {"role": b.role, "dtype": b.dtype.label, "shape": shape_json(b.shape)}
                   for name, b in p.buffers.items()}
        for launch in self.launches:
            for w in launch.workspaces:
                buffers[w.name] = {"role": "workspace", "dtype": w.dtype.label, "shape": [w.elements]}
        steps = {} if p.steps is None else {"steps": to_json(p.steps)}
        numbering: dict = {}
        return {
            **steps,
            "name": p.name, "arch": self.arch, "ptx_isa": T.ptx_isa(self.arch),
            "inputs": list(p.inputs), "outputs": list(p.outputs), "buffers": buffers,
            "launches": [{"entry": l.name, "kernel": l.kernel.name, "kind": l.kind,
                          "block": list(l.block), "grid": grid_json(l.grid),
                          "shared_bytes": l.shared_bytes, "params": l.params,
                          **({"loops": loops_json(l.loops, numbering)} if l.loops else {}),
                          **({"when": l.when.to_json()} if l.when is not None else {})}
                         for l in self.launches],
        }


def shape_json(shape) -> list:
    """A buffer's dims for JSON: ints, or text over the named sizes for dynamic dims."""
    return [d if isinstance(d, int) else size_text(d) for d in shape]


def compile_program(program: Program, arch: str = T.DEFAULT_ARCH) -> GpuModule:
    """PTX for every kernel of `program` and the launches that run them."""
    if program.fills and any(k.sizes for k in program.kernels):
        raise DynamicShapeError(f"@{program.name}: random draws (rand, randn, dropout) take static "
                                "shapes only, on CUDA as on the CPU")
    module, (launches,) = build_module([program], arch, [""], f"tc_{program.name}_{arch}")
    text = str(module)
    return GpuModule(program, arch, launches, text, to_ptx(text, arch, module.name))


def compile_batch(programs: Sequence[Program], arch: str = T.DEFAULT_ARCH) -> tuple[str, list[list[Launch]]]:
    """Several programs in one PTX module (entry points prefixed `p<i>_`): one LLVM run and
    one ptxas run check them all (the tests use this)."""
    module, launches = build_module(programs, arch, [f"p{i}_" for i in range(len(programs))], "tc_batch")
    return to_ptx(str(module), arch, module.name), launches


def build_module(programs: Sequence[Program], arch: str, prefixes: Sequence[str],
                 name: str) -> tuple[ir.Module, list[list[Launch]]]:
    """One NVPTX module with the launches of every program (names prefixed)."""
    T.check_arch(arch)
    module = ir.Module(name=name)
    module.triple = T.TRIPLE
    module.data_layout = T.data_layout(arch)
    out = []
    for program, prefix in zip(programs, prefixes):
        launches = []
        for k in program.kernels:
            with _naming_ops(program, k):
                # the fused attention's kernels get dedicated launches (attention.py), not a launch per tile
                mine = plan_attention(program, k) or plan_kernel(k)
                for launch in mine:
                    launch.name = prefix + launch.name
                    (emit_attention if is_attention(launch) else emit_launch)(module, launch)
            launches += mine
        out.append(launches)
    return module, out


@contextlib.contextmanager
def _naming_ops(program: Program, kernel):
    """A BackendError from planning or emitting `kernel` names its ops, their lines and the
    run-time sizes it takes (the message a user can act on)."""
    try:
        yield
    except BackendError as e:
        ops = program.kernel_ops.get(kernel.name, [])
        where = "; ".join(f"{op.name} at {op.loc}" if op.loc else op.name for op in ops[:4]) or kernel.name
        sizes = f"; dynamic sizes {', '.join(public_name(n) for n in kernel.sizes)}" if kernel.sizes else ""
        raise BackendError(f"{e} (PTX for {where}{sizes})") from e


def to_ptx(llvm_ir: str, arch: str, name: str) -> str:
    return T.emit_ptx(T.optimized_module(llvm_ir, arch, name), arch)
