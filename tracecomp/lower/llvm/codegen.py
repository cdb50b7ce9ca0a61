"""Loop-IR kernels to an LLVM module for the host CPU, ready for LLVM's optimization pipeline.

`codegen_kernels(kernels, module_name)` gives one module with a C-ABI function per Kernel
(emitter.py says what each looks like and what its caller guarantees).  This is where the
stages of llvm/ meet: KernelEmitter is emitter.py's FunctionEmitter with its two hooks
filled in, parallel Loops run on all cores (parallel.py) and Matmuls as the packed kernel
(gemm/matmul.py).  `codegen_program` adds, for a Program with loops and branches, the
driver that runs its steps with direct calls of the kernels (llvm/control.py): what the
`llvm` and `asm` stages show; the JIT compiles the same driver on its own, calling the
kernels through a table of their addresses.
"""
from __future__ import annotations

from typing import Optional, Sequence

import llvmlite.ir as ir

from ...core.errors import ArgumentError, BackendError
from ..loops.ir import Kernel, Loop, Matmul, PackB
from .emitter import BUFFER_ALIGN, FunctionEmitter, declare_kernel_function
from .gemm.matmul import cpu_body, emit_matmul, emit_pack_b
from .parallel import emit_parallel_loop


class KernelEmitter(FunctionEmitter):
    """The host CPU's emitter: threads for parallel loops, the packed kernel for Matmul."""

    def parallel_loop(self, s: Loop, env: dict[str, ir.Value]) -> None:
        emit_parallel_loop(self, s, env)

    def matmul(self, s: Matmul, env: dict[str, ir.Value]) -> None:
        emit_matmul(self, s, env)

    def pack_b(self, s: PackB, env: dict[str, ir.Value]) -> None:
        emit_pack_b(self, s, env)


FASTMATH_FLAGS = ("nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc")
_FLOAT_OPS = ("fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "fcmp")


def fastmath_flags(option) -> tuple[str, ...]:
    """The LLVM fast-math flags a `fastmath=` option asks for (Numba's convention): False
    none, True all of them ("fast"), or a collection of names from FASTMATH_FLAGS."""
    if option is False or option is None:
        return ()
    if option is True:
        return ("fast",)
    if isinstance(option, str) or not all(isinstance(f, str) for f in option):
        raise ArgumentError(f"fastmath= takes True, False or a set of LLVM fast-math flag names "
                            f"({', '.join(FASTMATH_FLAGS)}), not {option!r}")
    unknown = sorted(set(option) - set(FASTMATH_FLAGS))
    if unknown:
        raise ArgumentError(f"fastmath=: unknown flag(s) {', '.join(unknown)}; "
                            f"known: {', '.join(FASTMATH_FLAGS)}")
    return tuple(f for f in FASTMATH_FLAGS if f in option)


# A module of more kernels keeps them out of line: a caller that runs each once (an exported
# library's entry, a control driver) would otherwise inline all of them into one function,
# which LLVM optimizes in time superlinear in its size (an unrolled loop's: issue 35).
INLINE_MAX_KERNELS = 32


def codegen_kernels(kernels: Sequence[Kernel], module_name: str, *,
                    align: Optional[int] = BUFFER_ALIGN, fastmath: Sequence[str] = ()) -> ir.Module:
    """One LLVM module holding a C-ABI function per kernel (names must be distinct).
    `fastmath` flags (fastmath_flags) go on every floating-point instruction, the polynomial
    math included: the user's opt-in to assume no NaN/inf, reassociate, contract to FMA...
    Without them only accumulations carry `reassoc` (see `_accumulate`)."""
    module = ir.Module(name=module_name)
    seen: set[str] = set()
    for k in kernels:
        if k.name in seen:
            raise BackendError(f"two kernels are named '{k.name}'; a module needs distinct names")
        seen.add(k.name)
        fn = declare_kernel_function(module, k.name, k.buffers, k.sizes, align, "external")
        if len(kernels) > INLINE_MAX_KERNELS:
            fn.attributes.add("noinline")
        emitter = KernelEmitter(module, k, fn, align)
        emitter.emit_body(cpu_body(k), emitter.entry_env())
        emitter.finish()
    if fastmath:
        for fn in module.functions:
            for block in fn.blocks:
                for instr in block.instructions:
                    if instr.opname in _FLOAT_OPS:
                        instr.flags = [f for f in instr.flags if f not in fastmath] + list(fastmath)
    return module


def codegen_program(program, module_name: str, *, align: Optional[int] = BUFFER_ALIGN,
                    fastmath: Sequence[str] = ()) -> ir.Module:
    """The kernels of `program` (codegen_kernels) and, when it has steps, its driver
    `void <module_name>_driver(void** buffers, void* unused)`, which takes the buffers that
    are not bound in the Program's order."""
    module = codegen_kernels(program.kernels, module_name, align=align, fastmath=fastmath)
    if program.steps is not None:
        from .control import direct_call, driver_function
        functions = {k.name: module.get_global(k.name) for k in program.kernels}
        unbound = [n for n, b in program.buffers.items() if b.role != "bound"]
        driver_function(module, program, f"{module_name}_driver", {n: i for i, n in enumerate(unbound)},
                        lambda fn: direct_call(functions))
    return module
