"""Launches (launch.py) as NVPTX kernel functions in an llvmlite module.

Every entry point has the CPU kernel's signature, `void name(ptr buf..., i64 size...,
ptr workspace...)`, and is marked a kernel in `nvvm.annotations` with its block size.
Expressions, loads, stores, casts, math and serial loops are the CPU code generator's
(llvm.codegen.FunctionEmitter, llvm/scalar.py, llvm/math's polynomials: no libdevice);
GpuEmitter changes only what differs on a GPU:
- where the iteration space comes from (grid-stride loops over thread and block ids);
- Stores in a `rows` launch, which only thread 0 performs, and Loops there, which the
  block's threads share; atomic scatter-adds;
- Reduces in a `rows` launch, which the block's threads share (nvptx_reduce.py);
- Matmul, tiled through shared memory (nvptx_matmul.py).
`uniform` is true where every thread of the block runs the same code (a row's body):
only there may a block reduction (with its barriers) be emitted.
Flat indices are 32-bit when the iteration space is known to fit, else 64-bit.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import llvmlite.ir as ir

from ..errors import BackendError
from ..lower.llvm import scalar as S
from ..lower.llvm.codegen import FunctionEmitter, counted_loop, declare_kernel_function
from ..lower.loops.ir import Loop, Matmul, Reduce, Store
from . import nvptx_intrinsics as X
from .launch import (Launch, atomic_add_term, cooperative, disjoint_vars, iteration_local, perfect_nest,
                     static_product)

PARAM_ALIGN = 16        # cuMemAlloc returns 256-byte aligned memory; 16 allows vector loads
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
        self._cache.clear()
        self.uniform = True
        X.barrier(b)

    def reduce(self, s: Reduce, env: dict[str, ir.Value]) -> None:
        from .nvptx_reduce import block_reduce
        if self.uniform and self.threads > 1 and cooperative(s):
            block_reduce(self, s, env)
        else:
            super().reduce(s, env)

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


def emit_launch(module: ir.Module, launch: Launch) -> ir.Function:
    """The entry point of `launch` in `module`; sets launch.shared_bytes."""
    extra = [(w.name, ir.PointerType()) for w in launch.workspaces]
    k = launch.kernel
    fn = declare_kernel_function(module, launch.name, k.buffers, k.sizes, PARAM_ALIGN, "external", extra)
    for arg in fn.args[len(k.buffers) + len(k.sizes):]:
        arg.add_attribute("noalias")
    X.mark_kernel(module, fn, launch.block)
    em = GpuEmitter(module, launch, fn)
    if launch.kind == "matmul":
        from .nvptx_matmul import emit_matmul
        emit_matmul(em, launch.stmts[0])
    elif launch.kind in ("partials", "finish"):
        from .nvptx_reduce import emit_split
        emit_split(em)
    else:
        {"elementwise": _elementwise, "columns": _columns, "rows": _rows, "serial": _serial}[launch.kind](em)
    em.builder.ret_void()
    launch.shared_bytes = em.shared_bytes
    return fn


def _elementwise(em: GpuEmitter) -> None:
    """A grid-stride loop over the flattened outer loops of the nest."""
    b = em.builder
    dims, body = perfect_nest(em.launch.stmts[0])
    static = static_product([e for _, e in dims])
    wide = static is None or static >= WIDE_INDEX

    def reg(name):
        return em.sreg64(name) if wide else X.sreg(b, name)
    start = b.add(b.mul(reg("ctaid.x"), reg("ntid.x"), flags=("nuw",)), reg("tid.x"), flags=("nuw",))
    step = b.mul(reg("ntid.x"), reg("nctaid.x"), flags=("nuw",))
    total = em.product([e for _, e in dims]) if wide else ir.Constant(S.I32, static)
    em.atomic = True
    with strided_loop(b, start, total, step, "flat") as loop:
        env = em.entry_env()
        em.delinearize(loop.index, dims, env)
        em.emit_body(body, env)
        loop.next = []


def _columns(em: GpuEmitter) -> None:
    """A grid-stride loop over the nest's parallel loops (launch.disjoint_vars); each
    thread runs the other loops, in their order, at each of its points."""
    b = em.builder
    dims, body = perfect_nest(em.launch.stmts[0])
    parallel = disjoint_vars(em.launch.stmts, dims, em.launch.shared)
    outer = [d for d, p in zip(dims, parallel) if p]
    for var, extent in reversed([d for d, p in zip(dims, parallel) if not p]):
        body = [Loop(var, extent, body)]
    start = b.add(b.mul(em.sreg64("ctaid.x"), em.sreg64("ntid.x"), flags=("nuw",)), em.sreg64("tid.x"), flags=("nuw",))
    step = b.mul(em.sreg64("ntid.x"), em.sreg64("nctaid.x"), flags=("nuw",))
    with strided_loop(b, start, em.product([e for _, e in outer]), step, "point") as loop:
        env = em.entry_env()
        em.delinearize(loop.index, outer, env)
        em.emit_body(body, env)
        loop.next = []


def _rows(em: GpuEmitter) -> None:
    """One block per point of the outer loops (block-stride); the body runs uniformly."""
    stmts = em.launch.stmts
    dims, body = perfect_nest(stmts[0]) if isinstance(stmts[0], Loop) else ([], stmts)
    b = em.builder
    rows = em.product([e for _, e in dims])
    with strided_loop(b, em.sreg64("ctaid.x"), rows, em.sreg64("nctaid.x"), "row") as loop:
        env = em.entry_env()
        em.delinearize(loop.index, dims, env)
        em.uniform = True
        em.emit_body(body, env)
        em.uniform = False
        loop.next = []


def _serial(em: GpuEmitter) -> None:
    """The statements as one thread's loops (one block of one thread is launched)."""
    em.emit_body(em.launch.stmts, em.entry_env())
