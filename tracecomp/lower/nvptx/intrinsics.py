"""NVVM building blocks in llvmlite IR: special registers, barriers, warp shuffles, shared
memory arrays, atomics and the kernel annotation.

Shuffles move 32-bit lanes, so a 64-bit value travels as two halves and a bool as an i32.
Shared arrays are module globals in address space 3 with an undefined initializer (NVPTX
cannot initialize shared memory); every function that names one gets its own copy.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..llvm import scalar as S

SHARED = 3
FULL_MASK = ir.Constant(S.I32, -1)


def sreg(b: ir.IRBuilder, name: str) -> ir.Value:
    """An i32 special register: 'tid.x', 'ntid.x', 'ctaid.y', 'nctaid.x', ..."""
    fn = S.declare(b.module, f"llvm.nvvm.read.ptx.sreg.{name}", S.I32, [], attrs=("nounwind", "readnone"))
    return b.call(fn, [], name=name.replace(".", "_"))


def barrier(b: ir.IRBuilder) -> None:
    """__syncthreads(): every thread of the block reaches it before any goes on."""
    fn = S.declare(b.module, "llvm.nvvm.barrier0", ir.VoidType(), [], attrs=("nounwind", "convergent"))
    b.call(fn, [])


def _shfl32(b: ir.IRBuilder, v: ir.Value, lane_mask: int) -> ir.Value:
    suffix = "f32" if v.type == S.F32 else "i32"
    fn = S.declare(b.module, f"llvm.nvvm.shfl.sync.bfly.{suffix}", v.type, [S.I32, v.type, S.I32, S.I32],
                   attrs=("nounwind", "convergent"))
    return b.call(fn, [FULL_MASK, v, ir.Constant(S.I32, lane_mask), ir.Constant(S.I32, 31)])


def shuffle_xor(b: ir.IRBuilder, v: ir.Value, lane_mask: int) -> ir.Value:
    """The value `v` of lane (this lane ^ lane_mask), for any register type."""
    t = v.type
    if t in (S.I32, S.F32):
        return _shfl32(b, v, lane_mask)
    if t == S.I1:
        return b.trunc(_shfl32(b, b.zext(v, S.I32), lane_mask), S.I1)
    bits = b.bitcast(v, S.I64) if t == S.F64 else v
    lo = _shfl32(b, b.trunc(bits, S.I32), lane_mask)
    hi = _shfl32(b, b.trunc(b.lshr(bits, ir.Constant(S.I64, 32)), S.I32), lane_mask)
    joined = b.or_(b.zext(lo, S.I64), b.shl(b.zext(hi, S.I64), ir.Constant(S.I64, 32)))
    return b.bitcast(joined, S.F64) if t == S.F64 else joined


def shared_array(module: ir.Module, name: str, elem: ir.Type, count: int) -> ir.GlobalVariable:
    """A `[count x elem]` array in shared memory (a fresh global per name)."""
    ty = ir.ArrayType(elem, count)
    g = ir.GlobalVariable(module, ty, module.get_unique_name(name), addrspace=SHARED)
    g.linkage = "internal"
    g.initializer = ir.Constant(ty, ir.Undefined)
    g.align = 16
    g.type = ir.PointerType(addrspace=SHARED)      # opaque, so geps and stores type-check
    g.array_type = ty
    return g


def shared_element(b: ir.IRBuilder, array: ir.GlobalVariable, index: ir.Value) -> ir.Value:
    return b.gep(array, [ir.Constant(S.I32, 0), index], inbounds=True, source_etype=array.array_type)


def atomic_add(b: ir.IRBuilder, ptr: ir.Value, value: ir.Value) -> None:
    op = "fadd" if value.type in (S.F32, S.F64) else "add"
    b.atomic_rmw(op, ptr, value, "monotonic")


def mark_kernel(module: ir.Module, fn: ir.Function, block: tuple[int, int, int], min_blocks: int = 0) -> None:
    """Make `fn` a kernel entry point launched with exactly `block` threads (ptxas then
    budgets registers for that block size) and, with `min_blocks`, at least that many
    blocks resident per SM (__launch_bounds__'s second argument: a register cap)."""
    module.add_named_metadata("nvvm.annotations", [fn, "kernel", ir.Constant(S.I32, 1)])
    for axis, n in zip("xyz", block):
        module.add_named_metadata("nvvm.annotations", [fn, f"maxntid{axis}", ir.Constant(S.I32, n)])
    if min_blocks:
        module.add_named_metadata("nvvm.annotations", [fn, "minctasm", ir.Constant(S.I32, min_blocks)])
