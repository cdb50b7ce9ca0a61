"""GpuEmitter: the function emitter for NVPTX kernels (kernels.py builds each launch's
entry point with it).

Expressions, loads, stores, casts, math and serial loops are the CPU code generator's
(llvm/emitter.py's FunctionEmitter, llvm/scalar.py, llvm/math's polynomials: no libdevice);
GpuEmitter changes only what differs on a GPU:
- where the iteration space comes from (grid-stride loops over thread and block ids);
- Stores in a `rows` launch, which only thread 0 performs, and Loops there, which the
  block's threads share; atomic scatter-adds;
- Reduces in a `rows` launch, which the block's threads share (the `cooperative_reduce`
  hook: reduce.py);
- Matmul, tiled through shared memory (a launch of its own: matmul.py).
`uniform` is true where every thread of the block runs the same code (a row's body):
only there may a block reduction (with its barriers) be emitted.
Flat indices are 32-bit when the iteration space is known to fit, else 64-bit.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import llvmlite.ir as ir

from ...core.errors import BackendError
from ..llvm import scalar as S
from ..llvm.emitter import FunctionEmitter, counted_loop
from ..loops.ir import Loop, Matmul, Reduce, Store
from . import intrinsics as X
from .launch import Launch, atomic_add_term, iteration_local
from .shareable import cooperative

PARAM_ALIGN = None      # no alignment promised: a scan's row is its buffer offset by whole rows
                        # (element-aligned only), so 16-byte accesses check their pointers
WIDE_INDEX = 1 << 30    # flat iteration spaces at least this big use 64-bit indices


def strided_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: ir.Value, name: str,
                 carried: Sequence[ir.Value] = ()):
    """`for name in range(start, stop, step)` (step > 0; grid- and block-stride loops)
    carrying values: llvm.codegen.counted_loop with a runtime step."""
    return counted_loop(b, start, stop, name, carried, step=step)


class GpuEmitter(FunctionEmitter):
    def __init__(self, module: ir.Module, launch: Launch, fn: ir.Function):
        super().__init__(module, launch.kernel, fn, PARAM_ALIGN, in_parallel=True)
        self.launch = launch
        self.threads = launch.block[0] * launch.block[1] * launch.block[2]
        first = len(launch.kernel.buffers) + len(launch.kernel.sizes)
        self.workspaces = {w.name: (w, arg) for w, arg in zip(launch.workspaces, fn.args[first:])}
        self.uniform = False
        self.atomic = False
        self.shared_bytes = 0

    # ------------------------------------------------------------ thread ids
    def sreg64(self, name: str) -> ir.Value:
        return self.builder.zext(X.sreg(self.builder, name), S.I64)

    def shared_array(self, name: str, elem: ir.Type, count: int) -> ir.GlobalVariable:
        size = {S.I8: 1, S.I32: 4, S.F32: 4, S.I64: 8, S.F64: 8}[elem]
        self.shared_bytes += size * count
        return X.shared_array(self.module, f"{self.launch.name}.{name}", elem, count)

    @contextlib.contextmanager
    def thread0(self):
        """Code only thread 0 runs (non-uniform inside)."""
        saved, self.uniform = self.uniform, False
        tid = X.sreg(self.builder, "tid.x")
        with self.builder.if_then(self.builder.icmp_unsigned("==", tid, ir.Constant(S.I32, 0))):
            yield
        self.uniform = saved

    # ------------------------------------------------------------ statements
    def store(self, s: Store, env: dict[str, ir.Value]) -> None:
        if self.uniform:           # one thread stores; the barrier shows it to the others
            with self.thread0():
                self.store(s, env)
            X.barrier(self.builder)
            return
        if self.atomic:
            term = atomic_add_term(s, self.kernel_buffers)
            if term is not None:
                X.atomic_add(self.builder, self.address(s.buffer, s.index, env), self.expr(term, env))
                return
        super().store(s, env)

    @property
    def kernel_buffers(self):
        return {name: buf for name, (buf, _) in self.buffers.items()}

    def loop(self, s: Loop, env: dict[str, ir.Value]) -> None:
        """In a row's body the block's threads share the loop when its iterations touch
        distinct elements of the buffers the row also reads back (launch.iteration_local),
        else thread 0 runs it; barriers around it make what the row computed before
        visible to it, and what it stores visible to what follows."""
        if not self.uniform:
            super().loop(s, env)
            return
        b = self.builder
        X.barrier(b)
        if not iteration_local(s, self.launch.shared):
            with self.thread0():
                super().loop(s, env)
            X.barrier(b)
            return
        self.uniform = False
        with strided_loop(b, self.sreg64("tid.x"), self.extent(s.extent), self.sreg64("ntid.x"), s.var) as lp:
            self.emit_body(s.body, {**env, s.var: lp.index})
            lp.next = []
        self.forget_values()
        self.uniform = True
        X.barrier(b)

    def reduce(self, s: Reduce, env: dict[str, ir.Value]) -> None:
        if self.uniform and self.threads > 1 and cooperative(s):
            self.cooperative_reduce(s, env)
        else:
            super().reduce(s, env)

    def cooperative_reduce(self, s: Reduce, env: dict[str, ir.Value]) -> None:
        """A Reduce the block's threads share (a hook: kernels.py's LaunchEmitter fills it
        in with reduce.py's block reduction)."""
        raise BackendError(f"kernel '{self.kernel.name}': no block reduction for {s.var}")

    def matmul(self, s: Matmul, env: dict[str, ir.Value]) -> None:
        raise BackendError(f"kernel '{self.kernel.name}': a Matmul nested in other statements "
                           "has no PTX lowering (the scheduler emits them at the top level)")

    # ------------------------------------------------------------ index spaces
    def product(self, extents) -> ir.Value:
        total = ir.Constant(S.I64, 1)
        for e in extents:
            total = self.builder.mul(total, self.extent(e), flags=("nsw",))
        return total

    def delinearize(self, flat: ir.Value, dims, env: dict[str, ir.Value]) -> None:
        """Bind each (var, extent) of `dims` (outermost first) from a row-major flat index."""
        b, rest = self.builder, flat
        for k in reversed(range(len(dims))):
            var, extent = dims[k]
            n = self.extent(extent)
            if flat.type != S.I64:
                n = b.trunc(n, flat.type)
            if extent == 1:
                idx = ir.Constant(flat.type, 0)
            elif k == 0:
                idx = rest
            else:
                idx = b.urem(rest, n)
                rest = b.udiv(rest, n)
            env[var] = idx if idx.type == S.I64 else b.zext(idx, S.I64, name=var)
