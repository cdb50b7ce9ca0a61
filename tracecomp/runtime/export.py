"""Ahead-of-time export: a traced function as a shared library and a C header.

`export(fn, example_inputs, "libmodel.so", name=None, dynamic=None)` traces and schedules
`fn` for the example inputs' shapes and dtypes, then builds one LLVM module with

- the kernels (internal linkage, so two exported libraries in one process never bind each
  other's kernels), generated without the 64-byte pointer-alignment assumption so a C
  caller may pass any `malloc`ed buffer;
- the constants as global arrays and the temporaries' workspace, laid out by the same
  liveness plan as runtime/compiled.py: one zero-initialized, 64-byte aligned global for
  static shapes (so the library is not re-entrant: one call at a time per process), or
  one aligned_alloc'ed block per call where sizes are dynamic;
- `int NAME(const void* const* inputs, void* const* outputs, int64_t size...)`: checks
  that every size is >= 1, that no pointer is NULL and that every index input lies in
  range, runs the kernels in order, copies outputs that are inputs, constants, temps or
  repeats of another output, and returns 0 or an error code;
- `int NAME_checked(...)`, the same after comparing the caller's shapes with the compiled
  ones (dynamic sizes read from the input shapes);
- `const char* NAME_error_string(int code)` and `const char* NAME_metadata(void)` (a JSON
  text: tracecomp version, signature, target triple, CPU name and features).

The object comes from a PIC target machine for the host CPU; `cc -shared` links it with
libm and libgomp only.  `libNAME.h` next to it declares everything with comments.

Dynamic sizes (`dynamic={"x": {0: "batch"}}`): the function is traced with symbolic dims
(symbolic.py, TracedFunction.lower_dynamic); kernels take the sizes they use as trailing
index arguments, and export_sizes.py evaluates dims and byte counts in the entry point.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Optional, Sequence

import llvmlite.ir as ir
import numpy as np

from ..errors import ArgumentError, BackendError
from ..lower.loops.ir import Var
from .export_sizes import EntrySizes, describe_dim, public_name, size_names

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
WORKSPACE_ALIGN = 64

OK, ERR_NULL, ERR_SIZE, ERR_ALLOC, ERR_TOO_LARGE = 0, 1, 2, 3, 4
MAX_TOTAL_BYTES = 2.0 ** 62  # all buffers of one call together: far from int64's wrap-around
ERR_INDEX_BASE = 16          # 16 + j: index check j failed
ERR_INPUT_SHAPE = 1000       # 1000 + i: NAME_checked got a wrong shape for input i
ERR_OUTPUT_SHAPE = 2000      # 2000 + j: ... for output j

C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t",
           "bool": "uint8_t"}
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}


def export_library(fn: Callable, example_inputs: Sequence[Any], path: str, name: Optional[str] = None,
                   dynamic: Optional[dict] = None, *, _metadata_overrides: Optional[dict] = None) -> dict:
    """Write the shared library `path`, its header (same stem, `.h`) and its checksum
    (`path`.sha256) for `fn` at the example inputs' shapes and dtypes.  Returns the metadata
    written into the library."""
    from .. import __version__
    from . import target

    lowered, program = lower_for_export(fn, example_inputs, dynamic)
    name = name or default_name(path)
    if not name.isidentifier():
        raise ArgumentError(f"tc.export: name {name!r} is not a C identifier")
    sizes = size_names(program)
    clash = [public_name(n) for n in sizes if public_name(n) in ("inputs", "outputs")]
    if clash:
        raise ArgumentError(f"tc.export: dynamic size name {clash[0]!r} is taken by the entry "
                            "point's own parameters; pick another name")

    host = target.host_target()
    metadata = {
        "format": 1,
        "tracecomp_version": __version__,
        "name": name,
        "inputs": [_describe(program, n, i) for i, n in enumerate(program.inputs)],
        "outputs": [_describe(program, n, i) for i, n in enumerate(program.outputs)],
        "sizes": [public_name(n) for n in sizes],
        "dynamic": [{"name": public_name(v.name), "input": i, "axis": d}
                    for i, n in enumerate(program.inputs)
                    for d, v in enumerate(program.buffers[n].shape) if isinstance(v, Var)],
        "output_structure": structure_to_json(lowered.out_structure),
        "target": {"triple": host.triple, "cpu": host.cpu, "features": host.features},
    }
    if _metadata_overrides:            # tests only: fabricate a library for another machine
        metadata = _merge(metadata, _metadata_overrides)
    checks = [(i, n, c) for i, n in enumerate(program.inputs) for c in program.index_checks.get(n, [])]

    module = build_module(program, name, metadata, checks, lowered.fastmath)
    tm = target.host_target_machine(3, reloc="pic", codemodel="default")
    module_ref = target.optimize(target.parse(str(module), name), tm)
    obj = target.emit_object(module_ref, tm)
    _link(obj, path)
    header = os.path.splitext(path)[0] + ".h"
    with open(header, "w") as f:
        f.write(render_header(name, metadata, checks))
    return metadata


def lower_for_export(fn: Callable, example_inputs: Sequence[Any], dynamic: Optional[dict] = None):
    """(the Lowered signature, its scheduled Program) of `fn` at `example_inputs`, for any
    export target; refuses what no exported artifact can do (random draws).  `dynamic`
    ({arg: {axis: name}}) makes those dims sizes the library takes at run time."""
    from ..symbolic import DynamicShapeError
    from ..trace import TracedFunction, trace
    if not isinstance(example_inputs, (list, tuple)):
        raise ArgumentError("tc.export: example_inputs must be a list or tuple of the function's "
                            "positional arguments")
    traced = fn if isinstance(fn, TracedFunction) else trace(fn)
    if not dynamic:
        lowered = traced.lower(*example_inputs)
    else:
        try:
            lowered = traced.lower_dynamic(tuple(example_inputs), dynamic)
            lowered.program
        except DynamicShapeError as e:
            raise DynamicShapeError(f"tc.export: the dynamic sizes {dynamic} cannot flow through "
                                    f"this function: {e}") from e
    if lowered.program.fills:
        raise ArgumentError("tc.export: functions that draw random numbers (rand/randn) cannot "
                            "be exported yet")
    return lowered, lowered.program


def default_name(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    stem = stem[3:] if stem.startswith("lib") and len(stem) > 3 else stem
    cleaned = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in stem)
    return cleaned if cleaned and not cleaned[0].isdigit() else "model_" + cleaned


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def structure_to_json(structure) -> Any:
    """A pytree structure (pytree.flatten) as JSON: "*" for a tensor leaf, {"tuple": [...]},
    {"list": [...]}, {"dict": [[key, ...], ...]} (string keys), {"static": value}; None when
    something (a non-string key, an unserializable static) has no JSON form."""
    from .. import pytree

    def walk(st):
        if st == pytree.LEAF:
            return pytree.LEAF
        kind, body = st
        if kind == "static":
            if body is None or isinstance(body, (bool, int, float, str)):
                return {"static": body}
            raise ValueError
        if kind == "dict":
            if not all(isinstance(k, str) for k, _ in body):
                raise ValueError
            return {"dict": [[k, walk(v)] for k, v in body]}
        return {"list" if kind == "list" else "tuple": [walk(v) for v in body]}
    try:
        return walk(structure)
    except ValueError:
        return None


def structure_from_json(js):
    from .. import pytree
    if js == pytree.LEAF:
        return pytree.LEAF
    (kind, body), = js.items()
    if kind == "static":
        return ("static", body)
    if kind == "dict":
        return ("dict", tuple((k, structure_from_json(v)) for k, v in body))
    return (kind, tuple(structure_from_json(v) for v in body))


def output_paths(js) -> list[str]:
    """'result[1][0]' for each tensor leaf of a JSON structure, in order."""
    out: list[str] = []

    def walk(node, path):
        if node == "*":
            out.append(path)
            return
        (kind, body), = node.items()
        if kind == "dict":
            for k, v in body:
                walk(v, f"{path}[{k!r}]")
        elif kind != "static":
            for i, v in enumerate(body):
                walk(v, f"{path}[{i}]")
    if js is not None:
        walk(js, "result")
    return out


def _describe(program, buf_name: str, i: int) -> dict:
    b = program.buffers[buf_name]
    return {"index": i, "dtype": b.dtype.label, "shape": [describe_dim(s) for s in b.shape]}


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


def _place_temps(module, program, name: str, b: ir.IRBuilder, dims: EntrySizes, ptrs: dict, check):
    """Point every temp into the workspace: slots laid end to end at 64-byte boundaries.
    Static sizes: one zero-initialized global (the library is then not re-entrant).
    Dynamic sizes: a block from aligned_alloc per call, freed before returning (returned
    here; ERR_ALLOC when it fails).  The plan is runtime/compiled.py's; its slot sizes are
    symbolic.Dim values where dims are dynamic."""
    from .memory import plan_program
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
    alloc = _libc(module, "aligned_alloc", PTR, [I64, I64])
    heap = b.call(alloc, [ir.Constant(I64, WORKSPACE_ALIGN), b.add(at, ir.Constant(I64, WORKSPACE_ALIGN))])
    check(b.icmp_unsigned("==", heap, ir.Constant(PTR, None)), ERR_ALLOC)
    for n, slot in assignment.items():
        ptrs[n] = b.gep(heap, [starts[slot]], inbounds=True, source_etype=I8)
    return heap


def build_module(program, name: str, metadata: dict, checks: list, fastmath=()) -> ir.Module:
    from ..lower.llvm import scalar as S
    from ..lower.llvm.codegen import codegen_kernels
    from ..lower.llvm.emitter import counted_loop

    module = codegen_kernels(program.kernels, f"tc_export_{name}", align=None, fastmath=fastmath)
    kernels = {f.name: f for f in module.functions if not f.is_declaration}
    for f in kernels.values():
        f.linkage = "internal"

    ours = [name, f"{name}_checked", f"{name}_error_string", f"{name}_metadata"]
    clash = [n for n in ours if n in module.globals] + [k for k in kernels if k.startswith(name + "__")]
    if clash:
        raise ArgumentError(f"tc.export: the entry name {name!r} clashes with the kernel "
                            f"{clash[0]!r}; pass another name=")

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

    sizes = size_names(program)
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    entry = ir.Function(module, ir.FunctionType(I32, [PTR, PTR] + [I64] * len(sizes)), name)
    entry.args[0].name, entry.args[1].name = "inputs", "outputs"
    for arg, n in zip(entry.args[2:], sizes):
        arg.name = public_name(n)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    fail = entry.append_basic_block("fail")
    code_phi_incoming = []
    dims = EntrySizes(b, dict(zip(sizes, entry.args[2:])))

    def check(cond, code: int):
        ok = entry.append_basic_block()
        code_phi_incoming.append((ir.Constant(I32, code), b.block))
        b.cbranch(cond, fail, ok)
        b.position_at_end(ok)

    def slot_ptr(array, i: int):
        return b.load(b.gep(array, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR), typ=PTR)

    for value in dims.values.values():        # dynamic sizes: >= 1
        check(b.icmp_signed("<", value, ir.Constant(I64, 1)), ERR_SIZE)
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
    ptrs.update(consts)

    # index checks: every element of an index input within [0, size)
    for j, (i, n, c) in enumerate(checks):
        buf = program.buffers[n]
        et = S.memory_type(buf.dtype)
        with counted_loop(b, ir.Constant(I64, 0), dims.count(buf), f"idx{j}") as loop:
            v = b.load(b.gep(ptrs[n], [loop.index], inbounds=True, source_etype=et), typ=et)
            v = b.sext(v, I64) if et.width < 64 else v
            # unsigned compare: negative values wrap to huge ones and fail too
            check(b.icmp_unsigned(">=", v, dims.dim(c.size)), ERR_INDEX_BASE + j)

    heap = _place_temps(module, program, name, b, dims, ptrs, check)
    for k in program.kernels:
        b.call(kernels[k.name], [ptrs[buf.name] for buf in k.buffers] + [dims.values[s] for s in k.sizes])
    written = set()
    for i, n in enumerate(program.outputs):
        role = program.buffers[n].role
        if role == "output" and n not in written:
            written.add(n)
            continue
        buf = program.buffers[n]
        if not _maybe_empty(buf):
            b.call(memcpy, [out_ptrs[i], ptrs[n], dims.nbytes(buf), ir.Constant(ir.IntType(1), 0)])
    if heap is not None:
        b.call(_libc(module, "free", ir.VoidType(), [PTR]), [heap])
    b.ret(ir.Constant(I32, OK))

    b.position_at_end(fail)
    if code_phi_incoming:
        phi = b.phi(I32)
        for value, block in code_phi_incoming:
            phi.add_incoming(value, block)
        b.ret(phi)
    else:
        b.ret(ir.Constant(I32, ERR_NULL))

    _checked_entry(module, program, name, entry)

    # error strings
    messages = {OK: "ok", ERR_NULL: "a NULL pointer was passed for the inputs or outputs array "
                                    "or for a non-empty input or output",
                ERR_SIZE: "a dynamic size argument is less than 1",
                ERR_ALLOC: "could not allocate the workspace for these sizes (out of memory)",
                ERR_TOO_LARGE: "the dynamic sizes make the buffers larger than 2^62 bytes"}
    for j, (i, n, c) in enumerate(checks):
        buf = program.buffers[n]
        messages[ERR_INDEX_BASE + j] = (f"input {i} ({buf.dtype.label}{_shape_text(buf)}): an index is "
                                        f"out of bounds for dim {c.dim} with size {c.size} ({c.op})")
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

    md = _cstring(module, f"{name}__metadata_json", json.dumps(metadata, sort_keys=True))
    mf = ir.Function(module, ir.FunctionType(PTR, []), f"{name}_metadata")
    ir.IRBuilder(mf.append_basic_block("entry")).ret(md)
    return module


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
    if incoming:
        phi = b.phi(I32)
        for value, block in incoming:
            phi.add_incoming(value, block)
        b.ret(phi)
    else:
        b.unreachable()


def _link(obj: bytes, path: str) -> None:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise BackendError(f"tc.export needs a C compiler to link the shared library; '{cc}' was "
                           "not found (install gcc or set CC)")
    with tempfile.TemporaryDirectory(prefix="tracecomp_export_") as tmp:
        obj_path = os.path.join(tmp, "model.o")
        with open(obj_path, "wb") as f:
            f.write(obj)
        out_tmp = os.path.join(tmp, "lib.so")
        cmd = [cc, "-shared", "-o", out_tmp, obj_path, "-lm", "-lgomp"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BackendError(f"linking {path} failed ({' '.join(cmd)}): {r.stderr.strip()}")
        shutil.move(out_tmp, os.path.abspath(path))
    write_checksum(path)


def checksum_path(path: str) -> str:
    return path + ".sha256"


def write_checksum(path: str) -> None:
    """`path`.sha256 in sha256sum's format: tc.load checks a library against it, so a file
    damaged or truncated after export is refused before it is loaded."""
    import hashlib
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(checksum_path(path), "w") as f:
        f.write(f"{digest}  {os.path.basename(path)}\n")

def render_header(name: str, metadata: dict, checks: list) -> str:
    guard = f"TRACECOMP_{name.upper()}_H"
    t = metadata["target"]

    paths = output_paths(metadata.get("output_structure"))

    def rows(items, kind):
        lines = []
        for d in items:
            where = f"  = {paths[d['index']]} of the Python function" if kind == "outputs" and len(paths) == len(items) else ""
            ctype = C_TYPES[d["dtype"]]
            shape = "[" + ", ".join(map(str, d["shape"])) + "]"
            if all(isinstance(n, int) for n in d["shape"]):
                n = int(np.prod(d["shape"], dtype=np.int64))
                size = f"{ctype}[{n}], {n * ITEMSIZE[d['dtype']]} bytes"
            else:
                n = "*".join(f"({x})" if isinstance(x, str) and " " in x else str(x) for x in d["shape"])
                size = f"{ctype}[{n}], {n}*{ITEMSIZE[d['dtype']]} bytes"
            lines.append(f" *   {kind}[{d['index']}]: {d['dtype']}{shape}  -> {size}{where}")
        return "\n".join(lines) or f" *   (no {kind})"

    sizes = metadata.get("sizes", [])
    size_params = "".join(f", int64_t {n}" for n in sizes)
    if sizes:
        size_doc = (f" * {', '.join(sizes)}: the dynamic size{'s' if len(sizes) > 1 else ''} of this call "
                    "(>= 1), the dims named so below;\n"
                    " *   one library serves every value.  Temporaries are allocated per call (aligned_alloc).\n")
        reentrancy = (" * Re-entrant: temporaries live in memory allocated per call, and nothing else is\n"
                      " * written outside the caller's outputs, so several threads may call it at once.")
    else:
        size_doc = ""
        reentrancy = (" * Not re-entrant: the library keeps its temporaries in one static workspace, so at most\n"
                      " * one call may run at a time in a process (use a mutex if several threads call it).")

    check_lines = "\n".join(
        f" *   {ERR_INDEX_BASE + j}: inputs[{i}] has an index outside [0, {c.size}) ({c.op}, dim {c.dim})"
        for j, (i, _, c) in enumerate(checks)) or " *   (this function takes no index inputs)"
    return f"""/* lib{name}: generated by tracecomp {metadata['tracecomp_version']} (tc.export).
 *
 * Link with:  cc main.c -L. -l{name} -Wl,-rpath,'$ORIGIN'   (the library needs libc, libm, libgomp)
 * Compiled for {t['triple']}, CPU '{t['cpu']}': it may use every instruction that CPU has
 * (see {name}_metadata() for the exact feature list); do not run it on an older CPU.
 */
#ifndef {guard}
#define {guard}

#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#define {name.upper()}_NUM_INPUTS {len(metadata['inputs'])}
#define {name.upper()}_NUM_OUTPUTS {len(metadata['outputs'])}

/* Run the function once.
 *
 * inputs:  an array of {len(metadata['inputs'])} pointers, one per input, in this order:
{rows(metadata['inputs'], 'inputs')}
 * outputs: an array of {len(metadata['outputs'])} pointers to buffers the caller allocated, in this order:
{rows(metadata['outputs'], 'outputs')}
{size_doc} * {"Shapes are fixed except for the named sizes" if sizes else "Shapes are fixed (the library was compiled for exactly these shapes)"}; the element type
 * of each buffer is the C type shown; buffers are dense, row-major, need no particular
 * alignment, and outputs must not overlap each other or any input.
 *
 * Returns 0 on success, otherwise an error code ({name}_error_string(code) says what went
 * wrong) and the outputs are unspecified:
 *   1: a NULL pointer was passed
 *   2: a dynamic size is less than 1
 *   3: the workspace for these sizes could not be allocated
 *   4: the dynamic sizes make the buffers larger than 2^62 bytes (no int64 size may wrap)
{check_lines}
 * The library cannot check the sizes of the buffers: pass buffers of the sizes above.
{reentrancy}
 * Loops run in parallel on all cores through libgomp (OMP_NUM_THREADS limits it).
 * libgomp is not fork-safe: a child forked after a call must call omp_set_num_threads(1)
 * before calling again (or exec), else it can wait forever for threads it does not have.
 */
int {name}(const void* const* inputs, void* const* outputs{size_params});

/* The same, after checking the shapes the caller believes its buffers have:
 * input_shapes[i] points to inputs[i]'s dims (int64_t[rank], row-major order of dims;
 * may be NULL for a scalar), output_shapes likewise.  Dynamic sizes are taken from the
 * first input dim named after them.  A shape that differs from the one
 * compiled in returns {ERR_INPUT_SHAPE} + i (input i) or {ERR_OUTPUT_SHAPE} + j (output j) before
 * any buffer is touched; otherwise returns what {name}() returns. */
int {name}_checked(const void* const* inputs, const int64_t* const* input_shapes,
{' ' * (len(name) + 13)}void* const* outputs, const int64_t* const* output_shapes);

/* A static, NUL-terminated English message for an error code returned by {name}(). */
const char* {name}_error_string(int code);

/* A static, NUL-terminated JSON text describing the library:
 *   {{"format": 1, "tracecomp_version": ..., "name": "{name}",
 *    "inputs":  [{{"index": 0, "dtype": "float32", "shape": [..]}}, ...],
 *    "outputs": [...], "sizes": [names of the dynamic sizes, in argument order],
 *    "dynamic": [{{"name": ..., "input": i, "axis": d}}, ...],
 *    "target": {{"triple": ..., "cpu": ..., "features": "+avx2,+fma,-avx512f,..."}}}}
 * tc.load() in Python reads it to check inputs and the CPU. */
const char* {name}_metadata(void);

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""
