"""The computed-index checks of an exported library's entry point (entry_point.py).

The kernels record indices out of range in an error record (loops/ir.py's CheckedIndex);
the entry point keeps that record on its stack (`error_record`: a re-entrant library stays
re-entrant) and reads it after the kernels (`return_if_index_failed`): the lowest failed
check c returns ERR_COMPUTED_INDEX_BASE + c, with the index as the user computed it in a
thread-local that `int64_t NAME_error_index(void)` returns (like errno).  The metadata
lists the checks (`add_computed_checks`), so that tc.load raises the ShapeError a traced
function raises (`computed_index_error`).
"""
from __future__ import annotations

from typing import Optional

import llvmlite.ir as ir

from ..loops.ir import INDEX_ERRORS
from ..schedule.index_checks import IndexCheck

I32, I64 = ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
ERR_COMPUTED_INDEX_BASE = 3000   # 3000 + c: computed index check c failed (NAME_error_index says which index)


def add_computed_checks(metadata: dict, program) -> None:
    """Record the computed-index checks in `metadata` (which tc.export also hands to the C
    header and returns): code, op, dim, size and the user's source line of each."""
    metadata["computed_index_checks"] = [
        {"code": ERR_COMPUTED_INDEX_BASE + c, "op": k.op, "dim": k.dim, "size": dim_text(k.size),
         "loc": str(k.loc) if k.loc else None} for c, k in enumerate(program.computed_checks)]


def dim_text(size):
    """A graph dim for the metadata: an int, or a symbolic size's text ("n", "2*n")."""
    return size if isinstance(size, int) else str(size)


def computed_index_error(metadata: dict, code: int, index: Optional[int], sizes: Optional[dict] = None):
    """The ShapeError for an error code of a computed-index check (what the traced function
    raises), given the index NAME_error_index returned and the call's dynamic `sizes` (a
    size named by one shows its value); None for other codes."""
    for c in metadata.get("computed_index_checks", []):
        if isinstance(c, dict) and c.get("code") == code:
            size = c.get("size")
            if isinstance(size, str) and size in (sizes or {}):
                size = f"{size} = {sizes[size]}"
            check = IndexCheck(str(c.get("op")), c.get("dim"), size, c.get("loc"))
            return check.error("?" if index is None else index)
    return None


def error_index_function(module: ir.Module, name: str) -> None:
    """`int64_t NAME_error_index(void)`: the offending index of this thread's last call that
    returned ERR_COMPUTED_INDEX_BASE + c (a thread-local, like errno)."""
    fn = ir.Function(module, ir.FunctionType(I64, []), f"{name}_error_index")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(b.load(error_index_global(module, name), typ=I64))


def error_index_global(module: ir.Module, name: str, thread_local: bool = True) -> ir.GlobalVariable:
    """The error index's global, made on first use: thread-local in a library; a plain
    global in the JIT's entry point (LLJIT cannot allocate TLS; its caller holds a lock)."""
    g = module.globals.get(f"{name}__error_index")
    if g is None:
        g = ir.GlobalVariable(module, I64, f"{name}__error_index")
        g.linkage = "internal"
        if thread_local:
            g.storage_class = "thread_local"     # llvmlite has no TLS flag; it prints where LLVM expects it
        g.initializer = ir.Constant(I64, 0)
        g.align = 8
    return g


def error_record(b: ir.IRBuilder, program):
    """The computed checks' error record: zeroed int64 slots on the entry point's stack."""
    slots = ir.ArrayType(I64, program.buffers[INDEX_ERRORS].shape[0])
    here = b.block
    b.position_at_start(b.function.entry_basic_block)      # a static alloca, where LLVM expects it
    record = b.alloca(slots)
    b.position_at_end(here)
    b.store(ir.Constant(slots, None), record)
    return record


def return_if_index_failed(module: ir.Module, b: ir.IRBuilder, program, name: str, record, heap) -> None:
    """After the kernels: when the record's flag is set, keep the lowest failed check's
    index (as the user computed it) for NAME_error_index, free the workspace, and return
    ERR_COMPUTED_INDEX_BASE + that check."""
    def slot(k):
        return b.load(b.gep(record, [ir.Constant(I64, k)], inbounds=True, source_etype=I64), typ=I64)
    with b.if_then(b.icmp_unsigned("!=", slot(0), ir.Constant(I64, 0)), likely=False):
        code, index = ir.Constant(I32, ERR_COMPUTED_INDEX_BASE), ir.Constant(I64, 0)
        for c in reversed(range(len(program.computed_checks))):
            failed = b.icmp_unsigned("!=", slot(1 + 2 * c), ir.Constant(I64, 0))
            value = slot(2 + 2 * c)
            check = program.computed_checks[c]
            if check.wraps and isinstance(check.size, int):     # the graph wrapped negatives: undo it
                value = b.select(b.icmp_signed("<", value, ir.Constant(I64, 0)),
                                 b.sub(value, ir.Constant(I64, check.size)), value)
            code = b.select(failed, ir.Constant(I32, ERR_COMPUTED_INDEX_BASE + c), code)
            index = b.select(failed, value, index)
        b.store(index, error_index_global(module, name))
        if heap is not None:
            free = module.globals.get("free") or ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "free")
            b.call(free, [heap])
        b.ret(code)
