"""A scheduled Program compiled to native code, with the fast call path.

Built once per traced signature: the kernels are generated into one LLVM module and JIT
compiled into their own library (freed with this object), or their object code comes from
the on-disk compile cache (cache.py; `module` is then generated only if asked for);
temporaries get a workspace that is planned by liveness and kept across calls; constants
are copied once into aligned memory.  A call checks the inputs (shape, dtype, index
ranges) before any pointer reaches native code, allocates fresh aligned outputs, and runs
the kernels in order.
Not re-entrant: one compiled function must not run in two threads at once (shared workspace).
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ..errors import ArgumentError, ShapeError, add_location
from ..lower.llvm_codegen import codegen_kernels
from ..lower.schedule import Program
from .. import random as tc_random
from .cache import compile_kernels
from .memory import aligned_empty, buffer_nbytes, plan_program


def _check_indices(a: np.ndarray, checks) -> None:
    """Index values must lie in [0, size) of the dim they index, as eager execution demands."""
    lo, hi = int(a.min()), int(a.max())
    for c in checks:
        if lo < 0 or hi >= c.size:
            bad = lo if lo < 0 else hi
            err = ShapeError(f"{c.op}: index {bad} is out of bounds for dim {c.dim} with size {c.size}")
            raise add_location(err, str(c.loc) if c.loc else None)


class CompiledProgram:
    def __init__(self, program: Program):
        self.program = program
        # No alignment promise on pointers: NumPy hands us 16-byte aligned arrays, and copying
        # them to 64-byte alignment costs a full pass over memory, while unaligned vector loads
        # cost next to nothing on current x86 cores. Our own buffers are 64-byte aligned anyway.
        self.library = compile_kernels(program.kernels, self._module_name, align=None)
        self._lock = threading.Lock()
        self._fixed: dict[str, np.ndarray] = {}       # temps (workspace views) and constants
        self._plan_workspace()
        for name, value in program.constants.items():
            arr = aligned_empty(value.shape, value.dtype)
            arr[...] = value
            self._fixed[name] = arr
        self._outputs = [n for n, b in program.buffers.items() if b.role == "output"]
        self._calls = []
        for k in program.kernels:
            fn = self.library.function(k.name, None, *([ctypes.c_void_p] * len(k.buffers)))
            self._calls.append((fn, [b.name for b in k.buffers]))

    @property
    def _module_name(self) -> str:
        return f"tc_{self.program.name}"

    @functools.cached_property
    def module(self):
        """The kernels' LLVM module (llvmlite.ir), as compiled into `library`."""
        return codegen_kernels(self.program.kernels, self._module_name, align=None)

    def _plan_workspace(self) -> None:
        assignment, sizes = plan_program(self.program)
        slots = [aligned_empty((s,), np.uint8) for s in sizes]
        for name, slot in assignment.items():
            b = self.program.buffers[name]
            self._fixed[name] = slots[slot][:buffer_nbytes(b)].view(b.dtype.np).reshape(b.shape)
        self.workspace_bytes = sum(sizes)

    def check_inputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.program
        if len(inputs) != len(p.inputs):
            raise ArgumentError(f"compiled function @{p.name} takes {len(p.inputs)} inputs, got {len(inputs)}")
        ready = []
        for i, (name, a) in enumerate(zip(p.inputs, inputs)):
            b = p.buffers[name]
            a = np.asarray(a)
            if a.shape != tuple(b.shape) or a.dtype != b.dtype.np:
                raise ArgumentError(f"@{p.name}: input {i} must be {b.dtype.label}{list(b.shape)}, "
                                    f"got {a.dtype}{list(a.shape)}")
            if not a.flags.c_contiguous or a.ctypes.data % a.dtype.itemsize:
                copy = aligned_empty(a.shape, a.dtype)
                copy[...] = a
                a = copy
            if name in p.index_checks and a.size:
                _check_indices(a, p.index_checks[name])
            ready.append(a)
        return ready

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.program
        arrays = dict(zip(p.inputs, self.check_inputs(inputs)))
        for name in self._outputs:
            b = p.buffers[name]
            arrays[name] = aligned_empty(tuple(b.shape), b.dtype.np)
        with self._lock:
            arrays.update(self._fixed)
            for f in p.fills:
                gen = tc_random.generator()
                draw = gen.random if f.impl == "uniform" else gen.standard_normal
                arrays[f.buffer][...] = draw(f.shape, dtype=f.dtype.np)
            for fn, names in self._calls:
                fn(*[arrays[n].ctypes.data for n in names])
            return [self._result(arrays, name) for name in p.outputs]

    def _result(self, arrays: dict, name: str) -> np.ndarray:
        role = self.program.buffers[name].role
        return arrays[name] if role == "output" else np.array(arrays[name], copy=True)
