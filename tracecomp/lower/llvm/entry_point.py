"""The entry point of an exported shared library, as LLVM IR around the kernels.

`build_module(program, name, metadata, checks)` gives the module tc.export compiles: the
kernels (internal), `int NAME(inputs, outputs, sizes...)` that checks its arguments, places
the temps (a static block, or one aligned_alloc per call when sizes are dynamic; the JIT's
entry point keeps its block for the next call), runs the
index checks and the kernels and copies outputs that are inputs or constants;
`NAME_checked` that first compares the shapes the caller passes; `NAME_error_string`;
`NAME_error_index` (the offending index of the calling thread's last failed call); and
`NAME_metadata` (the JSON tc.load reads).  The error codes are the constants below; the C
header (c_header.py) documents them.

`build_jit_module(program, name)` is the same entry point for tc.trace's programs with
dynamic sizes (runtime/compiled.py DynamicProgram): `int NAME(inputs, outputs, kernels,
sizes...)`, whose kernels live in the JIT library any program's kernels compile into (and
the compile cache keeps) and are called through `kernels`, the table of their addresses;
the constants follow the inputs in `inputs`.

A Program with loops and branches runs its steps instead of its kernels in order: the
same native loops as the JIT's driver (llvm/control.py), so a while loop whose carry
holds a trip count read from an input (a tc.fori_loop with a tensor bound) runs that
many iterations inside NAME.

Indices the function computes are checked in the kernels (loops/ir.py's CheckedIndex);
the entry point reads their error record after the kernels and returns 3000 + c for a
failed check c, with NAME_error_index giving the index (entry_checks.py).
"""
from __future__ import annotations

import json
from typing import Any

import llvmlite.ir as ir
import numpy as np

from ...core.errors import ArgumentError
from ..schedule.workspace import plan_program
from . import scalar as S
from .codegen import codegen_kernels
from .control import direct_call, emit_steps, table_call
from .emitter import counted_loop
from .gemm.amx import request_tiles_on_load, uses_amx
from ..loops.ir import Var
from .entry_checks import (ERR_COMPUTED_INDEX_BASE, add_computed_checks, computed_index_error,  # noqa: F401
                           dim_text, error_index_function, error_index_global, error_record,
                           return_if_index_failed)
from .entry_sizes import EntrySizes, describe_dim, public_name, size_names

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)

PTR = ir.PointerType()
WORKSPACE_ALIGN = 64

OK, ERR_NULL, ERR_SIZE, ERR_ALLOC, ERR_TOO_LARGE, ERR_NO_TILES = 0, 1, 2, 3, 4, 5
MAX_TOTAL_BYTES = 2.0 ** 62  # all buffers of one call together: far from int64's wrap-around
ERR_INDEX_BASE = 16          # 16 + j: index check j failed
ERR_INPUT_SHAPE = 1000       # 1000 + i: NAME_checked got a wrong shape for input i
ERR_OUTPUT_SHAPE = 2000      # 2000 + j: ... for output j
# 3000 + c: computed index check c failed (entry_checks.ERR_COMPUTED_INDEX_BASE)


def _maybe_empty(b) -> bool:
    """Whether a buffer may hold no elements (a static 0 dim; dynamic sizes are >= 1)."""
    return any(d == 0 for d in b.shape if isinstance(d, int))


def _cstring(module: ir.Module, gname: str, text: str) -> ir.GlobalVariable:
    data = bytearray(text.encode("utf-8") + b"\0")
    g = ir.GlobalVariable(module, ir.ArrayType(I8, len(data)), gname)
    g.initializer = ir.Constant(ir.ArrayType(I8, len(data)), data)
    g.global_constant = True
    g.linkage = "internal"
    return g


def _libc(module: ir.Module, name: str, ret, args) -> ir.Function:
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name)


def _place_temps(module, program, name: str, b: ir.IRBuilder, dims: EntrySizes, ptrs: dict, check,
                 reuse: bool = False):
    """Point every temp into the workspace: slots laid end to end at 64-byte boundaries.
    Static sizes: one zero-initialized global (the library is then not re-entrant).
    Dynamic sizes: a block from aligned_alloc per call, freed before returning (returned
    here; ERR_ALLOC when it fails).  The plan is runtime/compiled.py's; its slot sizes are
    symbolic.Dim values where dims are dynamic.  `reuse` (the JIT's entry point): the block
    of the last call is taken when it is large enough (_reused_block)."""
    assignment, slot_sizes = plan_program(program)
    if all(isinstance(n, int) for n in slot_sizes):
        starts, at = [], 0
        for n in slot_sizes:
            starts.append(at)
            at += -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        ws_type = ir.ArrayType(I8, max(at, WORKSPACE_ALIGN))
        workspace = ir.GlobalVariable(module, ws_type, f"{name}__workspace")
        workspace.initializer = ir.Constant(ws_type, None)
        workspace.linkage = "internal"
        workspace.align = WORKSPACE_ALIGN
        for n, slot in assignment.items():
            ptrs[n] = b.gep(workspace, [ir.Constant(I64, 0), ir.Constant(I64, starts[slot])], inbounds=True)
        return None
    starts, at = [], ir.Constant(I64, 0)
    for n in slot_sizes:
        starts.append(at)
        at = b.add(at, dims.aligned(dims.dim(n), WORKSPACE_ALIGN))
    if reuse:
        heap = _reused_block(module, name, b, b.add(at, ir.Constant(I64, WORKSPACE_ALIGN)), check)
        for n, slot in assignment.items():
            ptrs[n] = b.gep(heap, [b.add(starts[slot], ir.Constant(I64, WORKSPACE_ALIGN))], inbounds=True,
                            source_etype=I8)
        return heap
    alloc = _libc(module, "aligned_alloc", PTR, [I64, I64])
    heap = b.call(alloc, [ir.Constant(I64, WORKSPACE_ALIGN), b.add(at, ir.Constant(I64, WORKSPACE_ALIGN))])
    check(b.icmp_unsigned("==", heap, ir.Constant(PTR, None)), ERR_ALLOC)
    for n, slot in assignment.items():
        ptrs[n] = b.gep(heap, [starts[slot]], inbounds=True, source_etype=I8)
    return heap


def _reused_block(module, name: str, b: ir.IRBuilder, size, check):
    """The JIT's workspace: the block the last call left in NAME__block (taken atomically:
    calls from several threads each get a block of their own) when it holds `size` bytes
    after its 64-byte header (its capacity), else a new one.  A fresh block per call would
    be page-faulted again every call once it is past malloc's mmap threshold (W8's
    temps); _keep_block puts it back."""
    cached = _block_global(module, name)
    old = b.atomic_rmw("xchg", cached, ir.Constant(PTR, None), "acq_rel")
    fits = b.alloca(PTR)
    b.store(ir.Constant(PTR, None), fits)
    with b.if_else(b.icmp_unsigned("!=", old, ir.Constant(PTR, None))) as (has, none):
        with has:
            enough = b.icmp_unsigned(">=", b.load(old, typ=I64), size)
            b.store(b.select(enough, old, ir.Constant(PTR, None)), fits)
            with b.if_then(b.not_(enough)):
                b.call(_libc(module, "free", ir.VoidType(), [PTR]), [old])
        with none:
            pass
    heap = b.alloca(PTR)
    b.store(b.load(fits, typ=PTR), heap)
    with b.if_then(b.icmp_unsigned("==", b.load(fits, typ=PTR), ir.Constant(PTR, None))):
        alloc = _libc(module, "aligned_alloc", PTR, [I64, I64])
        block = b.call(alloc, [ir.Constant(I64, WORKSPACE_ALIGN), b.add(size, ir.Constant(I64, WORKSPACE_ALIGN))])
        with b.if_then(b.icmp_unsigned("!=", block, ir.Constant(PTR, None))):
            b.store(size, block)
        b.store(block, heap)
    heap = b.load(heap, typ=PTR)
    check(b.icmp_unsigned("==", heap, ir.Constant(PTR, None)), ERR_ALLOC)
    return heap


def _block_global(module, name: str):
    g = module.globals.get(f"{name}__block")
    if g is None:
        g = ir.GlobalVariable(module, PTR, f"{name}__block")
        g.initializer = ir.Constant(PTR, None)
        g.linkage = "internal"
    return g


def _keep_block(module, name: str, b: ir.IRBuilder, heap) -> None:
    """Leave the workspace for the next call (freeing one another thread left meanwhile)."""
    other = b.atomic_rmw("xchg", _block_global(module, name), heap, "acq_rel")
    b.call(_libc(module, "free", ir.VoidType(), [PTR]), [other])


def _release_function(module, name: str) -> None:
    """`void NAME_release(void)`: free the kept workspace (the program is being dropped)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), f"{name}_release")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    _keep_block(module, name, b, ir.Constant(PTR, None))
    b.ret_void()


def build_module(program, name: str, metadata: dict, checks: list, fastmath=()) -> ir.Module:
    """The library's module: internal kernels, NAME, NAME_checked, NAME_error_string and
    NAME_metadata (see the module docstring)."""
    module = _kernels(program, name, fastmath)
    add_computed_checks(metadata, program)
    tiles_granted = request_tiles_on_load(module) if uses_amx(module) else None
    entry = _entry(module, program, name, checks, _constants(module, program, name), tiles_granted=tiles_granted)
    _checked_entry(module, program, name, entry)
    _error_strings(module, program, name, checks)
    error_index_function(module, name)
    _metadata(module, name, metadata)
    return module


def build_jit_module(program, name: str, least_size: int = 1) -> ir.Module:
    """The JIT's entry point of a program with dynamic sizes: NAME (the module docstring),
    NAME_error_string, NAME_error_index and NAME_release (frees the workspace NAME keeps
    between calls).  Index inputs are checked by the runtime before the call, as for a
    static program, so NAME checks none."""
    module = ir.Module(name=f"tc_jit_{name}")
    error_index_global(module, name, thread_local=False)
    _entry(module, program, name, [], None, least_size)
    _release_function(module, name)
    _error_strings(module, program, name, [])
    error_index_function(module, name)
    return module


def _kernels(program, name: str, fastmath) -> ir.Module:
    """The kernels, internal: two exported libraries in one process never bind each other's."""
    module = codegen_kernels(program.kernels, f"tc_export_{name}", align=None, fastmath=fastmath)
    kernels = {f.name: f for f in module.functions if not f.is_declaration}
    for f in kernels.values():
        f.linkage = "internal"

    ours = [name, f"{name}_checked", f"{name}_error_string", f"{name}_error_index", f"{name}_metadata"]
    clash = [n for n in ours if n in module.globals] + [k for k in kernels if k.startswith(name + "__")]
    if clash:
        raise ArgumentError(f"tc.export: the entry name {name!r} clashes with the kernel "
                            f"{clash[0]!r}; pass another name=")
    return module


def _constants(module: ir.Module, program, name: str) -> dict[str, ir.GlobalVariable]:
    """Each constant buffer as an internal, 64-byte aligned global array."""
    consts = {}
    for cname, value in program.constants.items():
        b = program.buffers[cname]
        raw = bytearray(np.ascontiguousarray(value, dtype=b.dtype.np).tobytes()) or bytearray(1)
        t = ir.ArrayType(I8, len(raw))
        g = ir.GlobalVariable(module, t, f"{name}__const_{len(consts)}")
        g.initializer = ir.Constant(t, raw)
        g.global_constant = True
        g.linkage = "internal"
        g.align = WORKSPACE_ALIGN
        consts[cname] = g
    return consts


def _entry(module: ir.Module, program, name: str, checks: list, consts: dict | None,
           least: int = 1, tiles_granted: ir.GlobalVariable | None = None) -> ir.Function:
    """`int NAME(inputs, outputs, sizes...)`: check the arguments, place the temps, run the
    index checks and the kernels, copy the outputs that are not written in place.  `consts`
    None: the JIT's entry point, `NAME(inputs, outputs, kernels, sizes...)` (build_jit_module).
    `tiles_granted`: the AMX kernels' flag (gemm/amx.py); 0 returns ERR_NO_TILES first."""
    sizes = size_names(program)
    jit = consts is None
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    entry = ir.Function(module, ir.FunctionType(I32, [PTR, PTR] + [PTR] * jit + [I64] * len(sizes)), name)
    entry.args[0].name, entry.args[1].name = "inputs", "outputs"
    size_args = entry.args[2 + jit:]
    for arg, n in zip(size_args, sizes):
        arg.name = public_name(n)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    fail = entry.append_basic_block("fail")
    code_phi_incoming = []
    dims = EntrySizes(b, dict(zip(sizes, size_args)))
    if jit:                                    # kernels through the table, constants after the inputs
        entry.args[2].name = "kernels"
        call = table_call({k.name: i for i, k in enumerate(program.kernels)},
                          lambda k: [dims.values[s] for s in k.sizes], argument=2)(entry)
    else:
        kernels = {f.name: f for f in module.functions if not f.is_declaration and f.linkage == "internal"}
        call = direct_call(kernels, lambda k: [dims.values[s] for s in k.sizes])

    def check(cond, code: int):
        ok = entry.append_basic_block()
        code_phi_incoming.append((ir.Constant(I32, code), b.block))
        b.cbranch(cond, fail, ok)
        b.position_at_end(ok)

    def slot_ptr(array, i: int):
        return b.load(b.gep(array, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR), typ=PTR)

    if tiles_granted is not None:              # Linux refused the tile state: a tile op would fault
        check(b.icmp_unsigned("==", b.load(tiles_granted, typ=I8), ir.Constant(I8, 0)), ERR_NO_TILES)
    for value in dims.values.values():        # dynamic sizes: >= 1 (>= 0: counts, transforms/staging.py)
        check(b.icmp_signed("<", value, ir.Constant(I64, least)), ERR_SIZE)
    if dims.values:                            # and small enough that no byte count wraps
        total = ir.Constant(ir.DoubleType(), 0.0)
        for buf in program.buffers.values():
            total = b.fadd(total, dims.approx_nbytes(buf))
        check(b.fcmp_unordered(">=", total, ir.Constant(ir.DoubleType(), MAX_TOTAL_BYTES)), ERR_TOO_LARGE)
    null = ir.Constant(PTR, None)
    check(b.icmp_unsigned("==", entry.args[0], null) if program.inputs else ir.Constant(ir.IntType(1), 0), ERR_NULL)
    check(b.icmp_unsigned("==", entry.args[1], null) if program.outputs else ir.Constant(ir.IntType(1), 0), ERR_NULL)
    ptrs: dict[str, Any] = {}
    for i, n in enumerate(program.inputs):
        p = slot_ptr(entry.args[0], i)
        if not _maybe_empty(program.buffers[n]):
            check(b.icmp_unsigned("==", p, null), ERR_NULL)
        ptrs.setdefault(n, p)
    out_ptrs = []
    for i, n in enumerate(program.outputs):
        p = slot_ptr(entry.args[1], i)
        if not _maybe_empty(program.buffers[n]):
            check(b.icmp_unsigned("==", p, null), ERR_NULL)
        out_ptrs.append(p)
        if program.buffers[n].role == "output":
            ptrs.setdefault(n, p)
    if jit:
        consts = {c: slot_ptr(entry.args[0], len(program.inputs) + j) for j, c in enumerate(program.constants)}
    ptrs.update(consts)

    # index checks: every element of an index input within [0, size)
    for j, (i, n, c) in enumerate(checks):
        buf = program.buffers[n]
        et = S.memory_type(buf.dtype)
        with counted_loop(b, ir.Constant(I64, 0), dims.count(buf), f"idx{j}") as loop:
            v = b.load(b.gep(ptrs[n], [loop.index], inbounds=True, source_etype=et), typ=et)
            v = b.sext(v, I64) if et.width < 64 else v
            # unsigned compare: negative values wrap to huge ones and fail too; where the
            # graph wraps negative indices, v + size must lie in [0, 2 size)
            size = dims.dim(c.size)
            if c.wraps:
                v, size = b.add(v, size), b.mul(size, ir.Constant(I64, 2))
            bad = b.icmp_unsigned(">=", v, size)
            if c.allowed is not None:                  # an ignore_index the graph maps away
                bad = b.and_(bad, b.icmp_signed("!=", v, ir.Constant(I64, c.allowed)))
            check(bad, ERR_INDEX_BASE + j)

    heap = _place_temps(module, program, name, b, dims, ptrs, check, reuse=jit)
    if program.index_errors is not None:
        ptrs[program.index_errors] = error_record(b, program)
    if program.steps is None:
        for k in program.kernels:
            call(b, k, [ptrs[buf.name] for buf in k.buffers])
    else:                                      # loops and branches around the kernels
        emit_steps(b, program, program.steps, ptrs, call)
    if program.index_errors is not None:
        return_if_index_failed(module, b, program, name, ptrs[program.index_errors], heap)
    written = set()
    for i, n in enumerate(program.outputs):
        role = program.buffers[n].role
        if role == "output" and n not in written:
            written.add(n)
            continue
        buf = program.buffers[n]
        if not _maybe_empty(buf):
            b.call(memcpy, [out_ptrs[i], ptrs[n], dims.nbytes(buf), ir.Constant(ir.IntType(1), 0)])
    if heap is not None and jit:
        _keep_block(module, name, b, heap)
    elif heap is not None:
        b.call(_libc(module, "free", ir.VoidType(), [PTR]), [heap])
    b.ret(ir.Constant(I32, OK))

    b.position_at_end(fail)
    _return_code(b, code_phi_incoming, lambda: b.ret(ir.Constant(I32, ERR_NULL)))
    return entry


def _error_strings(module: ir.Module, program, name: str, checks: list) -> None:
    """`const char* NAME_error_string(int code)`: a static English message per code."""
    messages = {OK: "ok", ERR_NULL: "a NULL pointer was passed for the inputs or outputs array "
                                    "or for a non-empty input or output",
                ERR_SIZE: "a dynamic size argument is less than 1",
                ERR_ALLOC: "could not allocate the workspace for these sizes (out of memory)",
                ERR_TOO_LARGE: "the dynamic sizes make the buffers larger than 2^62 bytes",
                ERR_NO_TILES: "the operating system did not grant the AMX tile state this library's "
                              "matrix products use (Linux's arch_prctl ARCH_REQ_XCOMP_PERM, asked when "
                              "the library was loaded)"}
    for j, (i, n, c) in enumerate(checks):
        buf = program.buffers[n]
        messages[ERR_INDEX_BASE + j] = (f"input {i} ({buf.dtype.label}{_shape_text(buf)}): an index is "
                                        f"out of bounds for dim {c.dim} with size {c.size} ({c.op})")
    for c, k in enumerate(program.computed_checks):
        where = f" at {k.loc}" if k.loc else ""
        messages[ERR_COMPUTED_INDEX_BASE + c] = (f"{k.op}: an index the function computes is out of bounds for "
                                                 f"dim {k.dim} with size {dim_text(k.size)}{where} "
                                                 f"({name}_error_index() gives the index)")
    for kind, names, base in (("input", program.inputs, ERR_INPUT_SHAPE), ("output", program.outputs, ERR_OUTPUT_SHAPE)):
        for i, n in enumerate(names):
            buf = program.buffers[n]
            messages[base + i] = (f"{kind} {i} must have shape {_shape_text(buf)} (dtype {buf.dtype.label}); "
                                  f"the shape passed to {name}_checked differs")
    es = ir.Function(module, ir.FunctionType(PTR, [I32]), f"{name}_error_string")
    eb = ir.IRBuilder(es.append_basic_block("entry"))
    unknown = es.append_basic_block("unknown")
    sw = eb.switch(es.args[0], unknown)
    for code, text in messages.items():
        blk = es.append_basic_block()
        sw.add_case(ir.Constant(I32, code), blk)
        ir.IRBuilder(blk).ret(_cstring(module, f"{name}__msg{code}", text))
    ir.IRBuilder(unknown).ret(_cstring(module, f"{name}__msg_unknown", "unknown error code"))


def _metadata(module: ir.Module, name: str, metadata: dict) -> None:
    """`const char* NAME_metadata(void)`: the JSON tc.load reads."""
    md = _cstring(module, f"{name}__metadata_json", json.dumps(metadata, sort_keys=True))
    mf = ir.Function(module, ir.FunctionType(PTR, []), f"{name}_metadata")
    ir.IRBuilder(mf.append_basic_block("entry")).ret(md)


def _shape_text(buf) -> str:
    return "[" + ", ".join(str(describe_dim(d)) for d in buf.shape) + "]"


def _checked_entry(module: ir.Module, program, name: str, entry: ir.Function) -> None:
    """`int NAME_checked(inputs, input_shapes, outputs, output_shapes)`: compares each
    shape array (int64_t[rank] per argument) with the compiled shape, then calls NAME.
    Dynamic sizes are read from the first input dim that carries each, then every dim that
    depends on them must match its value."""
    fn = ir.Function(module, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), f"{name}_checked")
    for arg, n in zip(fn.args, ("inputs", "input_shapes", "outputs", "output_shapes")):
        arg.name = n
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fail = fn.append_basic_block("fail")
    incoming = []
    null = ir.Constant(PTR, None)

    def check(cond, code):
        ok = fn.append_basic_block()
        incoming.append((ir.Constant(I32, code), b.block))
        b.cbranch(cond, fail, ok)
        b.position_at_end(ok)

    dims = EntrySizes(b, {})
    for shapes, names, base in ((fn.args[1], program.inputs, ERR_INPUT_SHAPE),
                                (fn.args[3], program.outputs, ERR_OUTPUT_SHAPE)):
        if not names:
            continue
        check(b.icmp_unsigned("==", shapes, null), ERR_NULL)
        for i, n in enumerate(names):
            shape = program.buffers[n].shape
            p = b.load(b.gep(shapes, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR), typ=PTR)
            if not shape:
                continue                       # a scalar: rank 0, nothing to compare
            check(b.icmp_unsigned("==", p, null), base + i)
            for d, size in enumerate(shape):
                v = b.load(b.gep(p, [ir.Constant(I64, d)], inbounds=True, source_etype=I64), typ=I64)
                if isinstance(size, Var) and size.name not in dims.values:
                    dims.values[size.name] = v          # the size's first occurrence defines it
                    check(b.icmp_signed("<", v, ir.Constant(I64, 1)), base + i)
                    continue
                check(b.icmp_signed("!=", v, dims.dim(size)), base + i)
    sizes = [dims.values[n] for n in size_names(program)]
    b.ret(b.call(entry, [fn.args[0], fn.args[2]] + sizes))
    b.position_at_end(fail)
    _return_code(b, incoming, b.unreachable)


def _return_code(b: ir.IRBuilder, incoming: list, otherwise) -> None:
    """At the shared failure block: return the error code of whichever check branched
    here (a phi over `incoming`, (code, block) pairs); `otherwise()` when none does."""
    if not incoming:
        otherwise()
        return
    phi = b.phi(I32)
    for value, block in incoming:
        phi.add_incoming(value, block)
    b.ret(phi)
