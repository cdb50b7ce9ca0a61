"""A loop's weights packed once, before the loop (the CPU's packed matmul).

The packed kernel copies B's panels into its workspace at every call (llvm/gemm/nest.py).
A product in a scan body whose B is a const of the scan (the same matrix at every step:
an RNN's recurrent weight, h @ W_hh^T forward and da @ W_hh backward) would pack all of
B at every step, the same panels each time: 1 MB per step and product for W12's LSTM.
`prepack_loop_weights` gives each such product a buffer that a PackB kernel fills once
before the loop (Matmul.b_packed), passed to the body as one more const.

For the CPU only: the program it returns differs from the scheduled one just by those
kernels and fields, which code generators without a packed kernel ignore (loops/ir.py),
but the PTX path and the export keep the program as scheduled.  Top-level scans only,
products without batch dims or windows whose B is a static view.
"""
from __future__ import annotations

import dataclasses
import math

from ..loops import control as C
from ..loops import ir as L
from ..loops.matmul import const_view
from .nests import fresh_name
from .tiles import PACKED_DTYPES, tiles_for


def prepack_loop_weights(program):
    """`program`, or a copy whose top-level scans read their weights' panels packed once."""
    if not program.steps or not any(isinstance(s, C.Scan) for s in program.steps):
        return program
    new = dataclasses.replace(program, buffers=dict(program.buffers), kernel_ops=dict(program.kernel_ops))
    replaced: dict[str, L.Kernel] = {}
    kernels = {k.name: k for k in program.kernels}
    steps = []
    for step in program.steps:
        if isinstance(step, C.Scan):
            runs, step = _prepack(new, step, kernels, replaced)
            steps += runs
        steps.append(step)
    if not replaced:
        return program
    new.steps = steps
    kernels.update(replaced)
    new.kernels = [kernels[name] for name in C.kernels_run(steps)]
    return new


def _candidate(kernel: L.Kernel, s, bound: dict[str, str]) -> bool:
    return (isinstance(s, L.Matmul) and s.workspace is not None and s.b_packed is None and not s.batch
            and s.b_windows is None and s.b.buffer in bound and const_view(s.b) is not None
            and all(isinstance(d, int) and d > 0 for d in (s.m, s.n, s.k))
            and kernel.buffer(s.out.buffer).dtype in PACKED_DTYPES
            # (half operands are packed by their path's own layout, each call: loops/check_matmul.py)
            and all(kernel.buffer(v.buffer).dtype == kernel.buffer(s.out.buffer).dtype for v in (s.a, s.b)))


def _prepack(program, step: C.Scan, kernels: dict, replaced: dict) -> tuple[list, C.Scan]:
    """(the Runs of the pack kernels, the scan reading their buffers) for `step`."""
    n_consts = len(step.consts)
    bound_to = dict(zip(step.body.inputs[:n_consts], step.consts))
    runs, new_consts, new_inputs = [], [], []
    for run in step.body.steps:
        if not isinstance(run, C.Run):
            continue
        kernel = replaced.get(run.kernel) or kernels[run.kernel]
        body, buffers, changed = list(kernel.body), list(kernel.buffers), False
        for i, s in enumerate(body):
            if not _candidate(kernel, s, bound_to):
                continue
            dtype = kernel.buffer(s.out.buffer).dtype
            nr = tiles_for(dtype).nr
            size = math.ceil(s.n / nr) * nr * s.k
            packed = fresh_name(program.buffers, f"{kernel.name}_bpack")
            program.buffers[packed] = L.Buffer(packed, dtype, (size,), "temp")
            inner = fresh_name(program.buffers, f"{kernel.name}_bpacked")
            program.buffers[inner] = L.Buffer(inner, dtype, (size,), "bound")
            source = program.buffers[bound_to[s.b.buffer]]
            pack = L.Kernel(f"{kernel.name}_pack{len(runs)}", [source, program.buffers[packed]],
                            [L.PackB(packed, dataclasses.replace(s.b, buffer=source.name), s.k, s.n)])
            program.kernel_ops[pack.name] = program.kernel_ops.get(kernel.name, [])
            replaced[pack.name] = pack
            runs.append(C.Run(pack.name))
            body[i] = dataclasses.replace(s, b_packed=inner)
            buffers.append(L.Buffer(inner, dtype, (size,), "input"))     # bound in the program, read here
            new_consts.append(packed)
            new_inputs.append(inner)
            changed = True
        if changed:
            replaced[kernel.name] = dataclasses.replace(kernel, body=body, buffers=buffers)
    if not runs:
        return [], step
    inputs = step.body.inputs
    block = dataclasses.replace(step.body, inputs=inputs[:n_consts] + new_inputs + inputs[n_consts:])
    return runs, dataclasses.replace(step, consts=step.consts + new_consts, body=block)
