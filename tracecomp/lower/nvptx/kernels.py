"""Launches (launch.py) as NVPTX kernel functions in an llvmlite module.

Every entry point has the CPU kernel's signature, `void name(ptr buf..., i64 size...,
ptr workspace...)`, and is marked a kernel in `nvvm.annotations` with its block size.  Its
body comes from the launch's kind: elementwise and column launches over a grid-stride
flat index, rows one per block, matmul tiles (matmul.py), split reductions
(reduce.py), or one thread.  LaunchEmitter is codegen.py's GpuEmitter with its
block reduction filled in.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..llvm import scalar as S
from ..llvm.emitter import declare_kernel_function
from ..loops.ir import Load, Loop, Reduce, Store
from . import intrinsics as X
from .launch import LARGE_TILE, Launch, disjoint_vars, perfect_nest, static_product
from .codegen import PARAM_ALIGN, WIDE_INDEX, GpuEmitter, strided_loop
from .matmul import emit_matmul
from .sgemm import emit_sgemm
from .reduce import block_reduce, emit_split
from .vector import aligned16, elementwise_vector, lane_load, lane_store
from .rowcache import RowCache


class LaunchEmitter(GpuEmitter):
    lanes = stored = None          # a vector body's lanes (vector.py)
    row = None                     # the row held in registers (rowcache.py)

    def cooperative_reduce(self, s: Reduce, env: dict[str, ir.Value]) -> None:
        if self.row is not None and s.extent == self.row.extent:
            self.row.reduce(s, env)
        else:
            block_reduce(self, s, env)

    def loop(self, s: Loop, env: dict[str, ir.Value]) -> None:
        if self.row is not None and self.uniform and s.extent == self.row.extent:
            self.row.loop(s, env)
        else:
            super().loop(s, env)

    def store(self, s: Store, env: dict[str, ir.Value]) -> None:
        if not lane_store(self, s, env) and not (self.row is not None and self.row.store(s, env)):
            super().store(s, env)

    def _expr(self, e, env: dict[str, ir.Value]) -> ir.Value:
        if isinstance(e, Load):
            value = lane_load(self, e)
            if value is None and self.row is not None:
                value = self.row.load(e, env)
            if value is not None:
                return value
        return super()._expr(e, env)


def emit_launch(module: ir.Module, launch: Launch) -> ir.Function:
    """The entry point of `launch` in `module`; sets launch.shared_bytes."""
    extra = [(w.name, ir.PointerType()) for w in launch.workspaces]
    k = launch.kernel
    fn = declare_kernel_function(module, launch.name, k.buffers, k.sizes, PARAM_ALIGN, "external", extra)
    for arg in fn.args[len(k.buffers) + len(k.sizes):]:
        arg.add_attribute("noalias")
    X.mark_kernel(module, fn, launch.block, 2 if launch.tile == LARGE_TILE else 0)   # <= 128 registers
    em = LaunchEmitter(module, launch, fn)
    if launch.kind == "matmul":
        (emit_sgemm if launch.tile == LARGE_TILE else emit_matmul)(em, launch.stmts[0])
    elif launch.kind in ("partials", "finish"):
        emit_split(em)
    else:
        {"elementwise": _elementwise, "columns": _columns, "rows": _rows, "serial": _serial}[launch.kind](em)
    em.finish()
    launch.shared_bytes = em.shared_bytes
    return fn


def _elementwise(em: GpuEmitter) -> None:
    """A grid-stride loop over the flattened outer loops of the nest (4 points a step
    over contiguous buffers: vector.py)."""
    if em.launch.vector > 1:
        elementwise_vector(em)
        return
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
    """One block per point of the outer loops (block-stride); the body runs uniformly
    (from registers where launch.row_extent is set: rowcache.py, 4 elements at a time
    where the row length allows and every buffer is 16-byte aligned, checked here)."""
    extent = em.launch.row_extent
    if not extent or extent % 4:
        _row_loop(em, 1)
        return
    b = em.builder
    with b.if_else(aligned16(b, [em.buffer_pointer(buf.name) for buf in em.kernel.buffers])) as (fast, slow):
        with fast:
            _row_loop(em, 4)
        with slow:
            _row_loop(em, 1)


def _row_loop(em: GpuEmitter, width: int) -> None:
    stmts = em.launch.stmts
    dims, body = perfect_nest(stmts[0]) if isinstance(stmts[0], Loop) else ([], stmts)
    b = em.builder
    em.forget_values()
    rows = em.product([e for _, e in dims])
    with strided_loop(b, em.sreg64("ctaid.x"), rows, em.sreg64("nctaid.x"), "row") as loop:
        env = em.entry_env()
        em.delinearize(loop.index, dims, env)
        em.uniform = True
        if em.launch.row_extent:
            em.row = RowCache(em, em.launch.row_extent, width)
        em.emit_body(body, env)
        if em.row is not None:
            em.row.flush()
            em.row = None
        em.uniform = False
        loop.next = []
    em.forget_values()


def _serial(em: GpuEmitter) -> None:
    """The statements as one thread's loops (one block of one thread is launched)."""
    em.emit_body(em.launch.stmts, em.entry_env())
