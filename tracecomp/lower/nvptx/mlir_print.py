"""The loop IR as it runs on the GPU, printed as upstream MLIR: one `func.func` per launch
(launch.py), its mapped loops as `scf.parallel` with `#gpu.loop_dim_map` processors (the
input form of MLIR's convert-parallel-loops-to-gpu), everything else as on the CPU
(loops/printer.py).  A `//` note above each function gives the launch configuration.

Processors: an elementwise nest's innermost loop goes to threads (thread_x) and the
outer ones to blocks (block_x, block_y, block_z, then sequential): the launch flattens
them into one grid-stride loop, which MLIR's mapping cannot say, so this is the nearest
picture.  A rows nest's loops go to blocks and its Reduce stays an `scf.for` (its
terms are split over the block's threads); a matmul's i and j loops go to blocks and
threads; a serial launch has no mapped loops.
"""
from __future__ import annotations

import dataclasses

from ..loops.ir import Kernel, Loop, Reduce
from ..loops.printer import print_kernels
from ..loops.matmul import index_names
from .launch import Launch, perfect_nest
from .program import GpuModule

BLOCKS = ("block_x", "block_y", "block_z")


def _serial(stmts: list) -> list:
    """The statements with every Loop sequential (mapping alone decides what is parallel)."""
    out = []
    for s in stmts:
        if isinstance(s, Loop):
            s = dataclasses.replace(s, parallel=False, body=_serial(s.body))
        elif isinstance(s, Reduce):
            s = dataclasses.replace(s, body=_serial(s.body))
        out.append(s)
    return out


def launch_mapping(launch: Launch) -> dict[str, str]:
    """Loop var -> GPU processor for the launch's loops."""
    if launch.kind == "matmul":
        names = index_names(launch.stmts[0])
        *batch, i, j = names
        return {**{b: "sequential" for b in batch[:-1]}, **({batch[-1]: "block_z"} if batch else {}),
                i: "block_y", j: "thread_x"}
    if launch.kind == "serial" or not isinstance(launch.stmts[0], Loop):
        return {}
    dims = [var for var, _ in perfect_nest(launch.stmts[0])[0]]
    processors = list(BLOCKS) if launch.kind != "elementwise" else ["thread_x", *BLOCKS]
    mapping = {}
    for k, var in enumerate(reversed(dims)):
        mapping[var] = processors[k] if k < len(processors) else "sequential"
    return mapping


def print_gpu_loops(gpu: GpuModule) -> str:
    """Every launch of `gpu` as a mapped `func.func`, in launch order, in one module."""
    kernels, mappings, notes = [], {}, {}
    for launch in gpu.launches:
        k = launch.kernel
        kernels.append(Kernel(launch.name, k.buffers, _serial(launch.stmts), k.sizes))
        mappings[launch.name] = launch_mapping(launch)
        notes[launch.name] = [f"launch {launch.name}: {launch.kind}, block {launch.block}, grid {launch.grid}"
                              f", {launch.shared_bytes} bytes shared"]
    return print_kernels(kernels, notes, gpu_mapping=mappings)
