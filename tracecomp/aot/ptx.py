"""`tc.export(fn, example_inputs, "model.ptx", target="cuda")`: the PTX and a JSON that
says how a C or C++ host program runs it with the CUDA driver API.

`model.ptx` is the module (load it with cuModuleLoadData); `model.json` (same stem) holds
  name, tracecomp_version, arch, ptx_isa;
  inputs / outputs: buffer names in call order, with dtype and shape (dense row-major);
  sizes, dynamic (only with `dynamic=`): the size names, and where each is read: {name,
    input, axis} per input dim that is a size (as the .so metadata); shapes, grids and
    index sizes elsewhere are then ints or text over these names (`(8 * batch)`, Python
    syntax, `//` the floor division), evaluated with the sizes of a call (each >= 1);
  output_structure: how the flat outputs nest (as in tc.export's .so metadata);
  buffers: every device buffer (role input, output, temp, constant, workspace or errors,
    dtype, shape): allocate each (at least 1 byte), temps and workspaces need no initial
    value; the "errors" buffer (int64, the kernels' record of computed indices out of
    range) must be zeroed before each run;
  constants: name -> dtype, shape and the values (row-major list) to copy in once;
  index_checks: input name -> [{op, dim, size, allowed, wraps}]: values must lie in [0, size)
    ([-size, size) when wraps: the graph counts negative ones from the end) or
  equal `allowed` when it is not null (an ignore_index), check
    them on the host before launching (kernels do not);
  computed_index_checks: [{op, dim, size, loc}] for the indices the kernels compute and
    check: after the launches, element 0 of the "errors" buffer is nonzero when one failed;
    then check c failed where element 1 + 2c is nonzero, and element 2 + 2c holds the
    largest offending index (compared as unsigned);
  launches: in order, each with its entry point, block, grid, static shared memory and
    params (buffer names whose device pointers, then `size_NAME` for the size NAME as an
    int64, form the kernel's arguments; every parameter is 64-bit); a grid dim is an int or
    {points, per_block, max}: min(ceil(points / per_block), max) blocks at a call's sizes;
    launches whose grid has a 0 are skipped, and so are those with a `when` ({value,
    at_least} or {value, below}) that does not hold at the call's sizes (a product over
    run-time sizes has two kernels, its 128 x 128 tiles chosen where there are enough);
  loops (on a launch, only with `dynamic=`): the host loops around it, outermost first, each
    {loop, var, trips}: consecutive launches with the same `loop` number form that loop's
    body, run `trips` times (text over the sizes and outer loop vars) with `var` = 0, 1, ...,
    passed as one more int64 parameter (named `var` in params) -- a fused attention's tile
    loops over a sequence of run-time length;
  steps (only for loops and branches): the order to run them in instead of the launches'
    own: {"kind": "run", "kernel"} runs that kernel's launches, "scan", "while" and "if"
    run their blocks on the host as lower/loops/control.py says (buffers of role "bound"
    get no memory: each is a device pointer the step sets, an operand, a row of a stacked
    buffer or a carry), as runtime/cuda/runner.py does.
Random draws (rand/randn) cannot be exported yet, as with the .so exporter.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional, Sequence

from ..core.errors import ArgumentError
from ..core.version import __version__
from ..lower.llvm.entry_sizes import describe_dim, public_name, size_names
from ..lower.loops.ir import Var
from ..lower.nvptx.target import DEFAULT_ARCH
from ..lower.nvptx.program import compile_program, shape_json


def export_ptx(fn: Callable, example_inputs: Sequence[Any], path: str, name: Optional[str] = None,
               target: str = "cuda", arch: str = DEFAULT_ARCH, dynamic: Optional[dict] = None) -> dict:
    """Write `path` (PTX) and its JSON description; returns the description.  `dynamic`
    ({arg: {axis: name}}) makes those dims sizes the kernels take at run time."""
    from ..tensors.pytree import structure_to_json
    from .shared_library import lower_for_export
    if target != "cuda":
        raise ArgumentError(f"tc.export: unknown target {target!r} (available: cpu, cuda)")
    lowered, program = lower_for_export(fn, example_inputs, dynamic)
    name = name or os.path.splitext(os.path.basename(path))[0]
    gpu = compile_program(program, arch)
    described = gpu.describe()
    if dynamic:
        described.update({
            "sizes": [public_name(n) for n in size_names(program)],
            "dynamic": [{"name": public_name(d.name), "input": i, "axis": axis}
                        for i, n in enumerate(program.inputs)
                        for axis, d in enumerate(program.buffers[n].shape) if isinstance(d, Var)]})
    described.update({
        "format": 1, "name": name, "tracecomp_version": __version__,
        "inputs": [_buffer(program, n) for n in program.inputs],
        "outputs": [_buffer(program, n) for n in program.outputs],
        "output_structure": structure_to_json(lowered.out_structure),
        "constants": {n: {"dtype": str(v.dtype), "shape": list(v.shape), "values": v.reshape(-1).tolist()}
                      for n, v in program.constants.items()},
        "index_checks": {n: [{"op": c.op, "dim": c.dim, "size": describe_dim(c.size), "allowed": c.allowed,
                                 "wraps": c.wraps} for c in cs]
                         for n, cs in program.index_checks.items()},
        "computed_index_checks": [{"op": c.op, "dim": c.dim, "size": describe_dim(c.size),
                                   "loc": str(c.loc) if c.loc else None}
                                  for c in program.computed_checks],
    })
    with open(path, "w") as f:
        f.write(gpu.ptx)
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump(described, f, indent=1)
    return described


def _buffer(program, name: str) -> dict:
    b = program.buffers[name]
    return {"buffer": name, "dtype": b.dtype.label, "shape": shape_json(b.shape)}
