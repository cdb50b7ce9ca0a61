"""Ahead-of-time export: a traced function as a shared library and a C header.

`export(fn, example_inputs, "libmodel.so", name=None, dynamic=None)` traces and schedules
`fn` for the example inputs' shapes and dtypes, then builds one LLVM module
(lower/llvm/entry_point.py) with

- the kernels (internal linkage, so two exported libraries in one process never bind each
  other's kernels), generated without the 64-byte pointer-alignment assumption so a C
  caller may pass any `malloc`ed buffer;
- the constants as global arrays and the temporaries' workspace, laid out by the same
  liveness plan as runtime/compiled.py: one zero-initialized, 64-byte aligned global for
  static shapes (so the library is not re-entrant: one call at a time per process), or
  one aligned_alloc'ed block per call where sizes are dynamic;
- `int NAME(const void* const* inputs, void* const* outputs, int64_t size...)`: checks
  that every size is >= 1, that no pointer is NULL and that every index input lies in
  range, runs the kernels in order (inside their loops and branches: the steps of
  llvm/control.py, so a loop is native code here too), copies outputs that are inputs,
  constants, temps or repeats of another output, and returns 0 or an error code;
- `int NAME_checked(...)`, the same after comparing the caller's shapes with the compiled
  ones (dynamic sizes read from the input shapes);
- `const char* NAME_error_string(int code)` and `const char* NAME_metadata(void)` (a JSON
  text: tracecomp version, signature, target triple, CPU name and features).

The object comes from a PIC target machine for the host CPU; `cc -shared` links it with
libm and libgomp only.  `libNAME.h` next to it (lower/llvm/c_header.py) declares
everything with comments.  This module keeps the steps around the code generators: tracing
and scheduling for export, the metadata, linking, and the files it writes.

Dynamic sizes (`dynamic={"x": {0: "batch"}}`): the function is traced with symbolic dims
(symbolic.py, TracedFunction.lower_dynamic); kernels take the sizes they use as trailing
index arguments, and lower/llvm/entry_sizes.py evaluates dims and byte counts in the entry
point.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Optional, Sequence

from ..lower import hostcpu
from ..core.errors import ArgumentError, BackendError
from ..core.version import __version__
from ..lower.llvm.c_header import render_header
from ..lower.llvm.entry_point import build_module
from ..lower.llvm.entry_sizes import describe_dim, public_name, size_names
from ..lower.loops.ir import Var
from ..tensors.pytree import structure_to_json
def export_library(fn: Callable, example_inputs: Sequence[Any], path: str, name: Optional[str] = None,
                   dynamic: Optional[dict] = None, *, _metadata_overrides: Optional[dict] = None) -> dict:
    """Write the shared library `path`, its header (same stem, `.h`) and its checksum
    (`path`.sha256) for `fn` at the example inputs' shapes and dtypes.  Returns the metadata
    written into the library."""
    from ..lower.llvm import target

    lowered, program = lower_for_export(fn, example_inputs, dynamic)
    name = name or default_name(path)
    if not name.isidentifier():
        raise ArgumentError(f"tc.export: name {name!r} is not a C identifier")
    sizes = size_names(program)
    clash = [public_name(n) for n in sizes if public_name(n) in ("inputs", "outputs")]
    if clash:
        raise ArgumentError(f"tc.export: dynamic size name {clash[0]!r} is taken by the entry "
                            "point's own parameters; pick another name")

    host = hostcpu.detected_target()       # the ISA the library needs (without the tuning flags)
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
    install(path, _link(obj, path), render_header(name, metadata, checks))
    return metadata


def lower_for_export(fn: Callable, example_inputs: Sequence[Any], dynamic: Optional[dict] = None):
    """(the Lowered signature, its scheduled Program) of `fn` at `example_inputs`, for any
    export target; refuses what no exported artifact can do (random draws).  `dynamic`
    ({arg: {axis: name}}) makes those dims sizes the library takes at run time."""
    from ..core.symbolic import DynamicShapeError
    from ..transforms.trace import TracedFunction, trace
    if not isinstance(example_inputs, (list, tuple)):
        raise ArgumentError("tc.export: example_inputs must be a list or tuple of the function's "
                            "positional arguments")
    traced = fn if isinstance(fn, TracedFunction) else trace(fn)
    if not dynamic:
        lowered = traced.lower_baked(*example_inputs)     # closed-over tensors become constants
    else:
        try:
            lowered = traced.lower_dynamic(tuple(example_inputs), dynamic)
            lowered.program
        except DynamicShapeError as e:
            raise DynamicShapeError(f"tc.export: the dynamic sizes {dynamic} cannot flow through "
                                    f"this function: {e}") from e
    if lowered.mutated_inputs:
        raise ArgumentError(f"tc.export: the function changes its argument(s) "
                            f"{', '.join(map(str, lowered.mutated_inputs))} in place (item assignment or "
                            "an in-place operator); an exported library does not write into its inputs. "
                            "Return the new value instead")
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


def _describe(program, buf_name: str, i: int) -> dict:
    b = program.buffers[buf_name]
    return {"index": i, "dtype": b.dtype.label, "shape": [describe_dim(s) for s in b.shape]}


def _link(obj: bytes, path: str) -> bytes:
    """The shared library linked from object code `obj` (`path` only names it in errors).
    cc works in a private temporary folder; nothing is written beside `path` yet."""
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
        with open(out_tmp, "rb") as f:
            return f.read()


def install(path: str, library: bytes, header: str) -> None:
    """Put `library` at `path`, its checksum at `path`.sha256 and `header` at the same stem
    with `.h`, each as a new file renamed over the old one (safe_files.write_beside), so a
    file is never rewritten in place: a process that has the old library loaded keeps
    running the old code, on whatever file system `path` lies.

    Order: all three are written first; then the checksum is renamed into place, then the
    header, and the library last.  tc.load reads a library before its checksum, so a
    reader that got the new library always finds the new checksum beside it; one that got
    the old library just before the last rename may find the new checksum, sees a
    mismatch, and reads both again (loader._read_checked).  If anything fails, the
    temporary files are removed and the files already renamed stay (a new checksum
    beside an old library is refused by tc.load, never accepted)."""
    from ..core.safe_files import write_beside
    header_path = os.path.splitext(path)[0] + ".h"
    for target in (path, header_path, checksum_path(path)):
        if os.path.isdir(target):         # before anything is renamed: no half-written set
            raise BackendError(f"tc.export: cannot write {target}: it is a directory")
    staged: list[tuple[str, str]] = []
    try:
        staged.append((write_beside(checksum_path(path), checksum_text(library, path).encode()),
                       checksum_path(path)))
        staged.append((write_beside(header_path, header.encode()), header_path))
        staged.append((write_beside(path, library, 0o777), path))
        while staged:
            temp, final = staged[0]
            os.replace(temp, final)
            staged.pop(0)
    except OSError as e:
        raise BackendError(f"tc.export: cannot write {path} (or its .h and .sha256 files): "
                           f"{e.strerror or e}") from None
    finally:
        for temp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def checksum_path(path: str) -> str:
    return path + ".sha256"


def checksum_text(library: bytes, path: str) -> str:
    """The `path`.sha256 line for `library`, in sha256sum's format: tc.load checks a
    library against it, so a file damaged or truncated after export is refused."""
    return f"{hashlib.sha256(library).hexdigest()}  {os.path.basename(path)}\n"
