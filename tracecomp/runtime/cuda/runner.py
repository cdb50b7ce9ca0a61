"""A scheduled Program run on a CUDA device: what `tc.trace(fn, device="cuda")` calls.

Built once per traced signature: the context is found first (no driver or no GPU raises
CudaUnavailableError before any compiling; memory.context() is the host emulator under
TRACECOMP_CUDA_EMULATOR=1), the PTX is generated for the newest architecture tracecomp
knows that the device can run, and the driver loads it.  Device memory for temporaries
and workspaces is allocated once and kept across calls; constants are copied once.  A
call takes device arrays as they are and copies host arrays in (checking shape, dtype and
index ranges, as the CPU backend does), fills random buffers from the host, queues every
non-empty launch in order on the default stream and returns the outputs as fresh device
arrays from the pool (memory.py) without waiting: the host waits only where it reads a
value.  Where the program computes indices, its error record (loops/ir.py's CheckedIndex)
is zeroed before the launches and read after them (a wait): a failed check raises the
ShapeError the CPU backend raises.  Not re-entrant (one lock per program).

With dynamic dims (tc.trace(..., dynamic=...)) the program is compiled once for every
size: a call reads the sizes from its inputs' shapes (entry_sizes.ShapeEquations, as the
CPU's DynamicProgram), sizes its outputs and the temporaries whose shape depends on them
(pool blocks per call: the pool's stream order makes that safe, memory.py), evaluates
each launch's grid (lower/nvptx/grid.py) and passes the sizes after the kernel's buffer
pointers, as the CPU kernels take them; a loop over products with a run-time trip count
runs here, its var one more argument of the launches inside (lower/nvptx/hostloops.py),
and a launch with a `when` runs only where it holds (one of two kernels chosen per call).
Random draws keep static shapes.

Loops and branches (Program.steps, loops/control.py) run on the host: this module walks
the steps in Python, launching each kernel's launches where the steps call it, pointing
bound buffers at device addresses (consts as they are, scan rows as byte offsets, carries
ping-ponging between the result buffer and its spare), reading a while loop's predicate
and a cond's back to the host (a one-byte copy, which waits for the launches before it)
and copying a carry on the device where a while loop ends in the spare.  So a loop costs
one round of launches per iteration, and a while loop one synchronization per iteration.
"""
from __future__ import annotations

import ctypes
import dataclasses
import threading
from typing import Optional

import numpy as np

from ...core import random as tc_random
from ...core.errors import ArgumentError, BackendError
from ...core.symbolic import evaluate
from ...lower.schedule.scheduler import Program
from ...lower.schedule.index_checks import recorded_error
from ..compiled import check_indices
from . import driver, memory
from .memory import DeviceArray
from ...lower.loops import control as C
from ...lower.loops.ir import SIZE_PREFIX
from ...lower.llvm.entry_sizes import ShapeEquations, size_names
from ...lower.nvptx.grid import size_value
from ...lower.nvptx.hostloops import in_order
from ...lower.nvptx.target import PTX_ISA
from ...lower.nvptx.program import GpuModule, compile_program


def arch_for(capability: tuple[int, int]) -> str:
    """The newest architecture in PTX_ISA (plain sm_NN) the device can run; PTX is forward
    compatible, so e.g. sm_90 code runs on later GPUs through the driver's JIT."""
    have = capability[0] * 10 + capability[1]
    usable = [a for a in PTX_ISA if a[3:].isdigit() and int(a[3:]) <= have]
    if not usable:
        raise BackendError(f"the CUDA device has compute capability {capability[0]}.{capability[1]}; "
                           f"tracecomp's PTX needs 8.0 or newer")
    return max(usable, key=lambda a: int(a[3:]))


class CudaProgram:
    def __init__(self, program: Program, ctx: Optional[driver.Context] = None):
        self.ctx = ctx if ctx is not None else memory.context()
        self.program = program
        self.sizes = set(size_names(program))   # the kernels' size parameters (dynamic dims)
        self.equations = ShapeEquations([program.buffers[n].shape for n in program.inputs],
                                        [f"@{program.name}: input {i}" for i in range(len(program.inputs))])
        self.gpu: GpuModule = compile_program(program, arch_for(self.ctx.compute_capability))
        self.module = self.ctx.load(self.gpu)
        self._lock = threading.Lock()
        self.device: dict[str, int] = {}
        self.scratch: list[str] = []            # temporaries sized per call (dynamic dims)
        for name, b in program.buffers.items():
            if b.role in ("input", "bound", "output"):
                continue
            if all(isinstance(d, int) for d in b.shape):
                self.device[name] = self.ctx.alloc(_nbytes(b.shape, b.dtype.np))
            else:
                self.scratch.append(name)
        for launch in self.gpu.launches:
            for w in launch.workspaces:
                self.device[w.name] = self.ctx.alloc(w.elements * w.dtype.itemsize)
        for name, value in program.constants.items():
            self.ctx.to_device(self.device[name], value)
        self.calls = [(self.module.function(l.name), l) for l in self.gpu.launches if not l.empty]
        self.by_kernel: dict[str, list] = {}          # the launches of each kernel, for the steps
        for fn, launch in self.calls:
            self.by_kernel.setdefault(launch.kernel.name, []).append((fn, launch))

    def check_inputs(self, inputs: list) -> tuple[list, dict[str, int]]:
        """(the inputs as NumPy arrays (to be copied) or DeviceArrays (used in place), each
        checked against the program's buffers; the size parameters their shapes give)."""
        p = self.program
        if len(inputs) != len(p.inputs):
            raise ArgumentError(f"compiled function @{p.name} takes {len(p.inputs)} inputs, got {len(inputs)}")
        ready = []
        arrays = [a if isinstance(a, DeviceArray) else np.asarray(a) for a in inputs]
        named = self.equations.bind([a.shape for a in arrays]) if self.sizes else {}
        sizes = {SIZE_PREFIX + n: v for n, v in named.items()}
        for i, (name, a) in enumerate(zip(p.inputs, arrays)):
            b = p.buffers[name]
            if isinstance(a, DeviceArray):
                if a.ctx is not self.ctx:
                    raise ArgumentError(f"@{p.name}: input {i} lives on another device context")
            else:
                if not a.flags.c_contiguous:        # (np.ascontiguousarray would make 0-d arrays 1-d)
                    a = np.ascontiguousarray(a)
            shape = _shape(b.shape, sizes)
            if tuple(a.shape) != shape or a.dtype != b.dtype.np:
                raise ArgumentError(f"@{p.name}: input {i} must be {b.dtype.label}{list(shape)}, "
                                    f"got {a.dtype}{list(a.shape)}")
            if name in p.index_checks and a.size:
                # the indices are checked on the host, as on the CPU (a device input is read back)
                check_indices(a.to_host() if isinstance(a, DeviceArray) else a,
                              [_at(c, named) for c in p.index_checks[name]])
            ready.append(a)
        return ready, sizes

    def __call__(self, inputs: list) -> list[DeviceArray]:
        """The outputs, in fresh device arrays from the pool.  Launches are queued on the
        default stream and the call returns without waiting for them, unless it must read
        a value back: the error record of computed index checks, or a while loop's or a
        cond's predicate."""
        p, ctx = self.program, self.ctx
        on_device = {}
        with self._lock:
            ctx.make_current()
            ready, sizes = self.check_inputs(inputs)
            for name, a in zip(p.inputs, ready):
                if not isinstance(a, DeviceArray):
                    a = DeviceArray.from_host(a, ctx)
                elif name in p.donated and sum(b is a for b in ready) > 1:
                    a = a.copy()        # donated, but also passed as another input: written into a copy
                on_device[name] = a
            results = {name: DeviceArray(_shape(b.shape, sizes), b.dtype.np, ctx=ctx)
                       for name, b in p.buffers.items() if b.role == "output"}
            # kept until the call returns; the pool hands a block out again only to later work
            scratch = [DeviceArray((_nbytes(_shape(p.buffers[n].shape, sizes), p.buffers[n].dtype.np),), np.uint8,
                                   ctx=ctx) for n in self.scratch]
            pointers = {**self.device, **{n: a.ptr for n, a in on_device.items()},
                        **{n: a.ptr for n, a in results.items()}, **{n: a.ptr for n, a in zip(self.scratch, scratch)},
                        **sizes}
            for f in p.fills:
                gen = tc_random.generator()
                draw = gen.random if f.impl == "uniform" else gen.standard_normal
                ctx.to_device(pointers[f.buffer], draw(f.shape, dtype=f.dtype.np))
            record = self._error_record()
            if record is not None:
                ctx.to_device(pointers[p.index_errors], record)
            if p.steps is None:
                self._run_launches(self.calls, pointers)
            else:
                self._run_steps(p.steps, pointers)
            if record is not None:
                named = {n[len(SIZE_PREFIX):]: v for n, v in sizes.items()}
                err = recorded_error([_at(c, named) for c in p.computed_checks],
                                     ctx.to_host(record, pointers[p.index_errors]))
                if err is not None:
                    raise err
            return [self._result(name, on_device, results) for name in p.outputs]

    def on_host(self, inputs: list) -> list[np.ndarray]:
        """The outputs copied back to host memory (waiting for the launches)."""
        return [a.to_host() for a in self(inputs)]

    def _run_launches(self, calls: list, env: dict) -> None:
        """Each (function, launch) of `calls` in order, inside their host loops (hostloops.py).
        `env`: buffer -> device address, size parameter -> its value at this call."""
        for (fn, launch), inner in in_order(calls, env, _loops):
            grid = launch.grid_at(inner)
            if 0 in grid or (launch.when is not None and not launch.when.holds(inner)):
                continue
            ints = launch.kernel.sizes       # the sizes and host loop vars, after the pointers
            self.ctx.launch(fn, grid, launch.block,
                            [ctypes.c_int64(inner[n]) if n in ints else ctypes.c_uint64(inner[n])
                             for n in launch.params])

    def _run_steps(self, steps: list, env: dict) -> None:
        """The steps on the host (see the module docstring); `env`: buffer -> device address."""
        buffers = self.program.buffers

        def nbytes(name: str) -> int:
            return _nbytes(_shape(buffers[name].shape, env), buffers[name].dtype.np)

        def row(name: str, r: int) -> int:
            n = _shape(buffers[name].shape, env)[0]
            return env[name] + r * (nbytes(name) // n)

        def run(block, inputs, outputs=()):
            inner = dict(env)
            inner.update(zip(block.inputs, inputs))
            inner.update(zip(block.outputs, outputs))
            self._run_steps(block.steps, inner)
            return inner

        def true(name: str, scope: dict) -> bool:
            return bool(self.ctx.to_host(np.zeros((), np.uint8), scope[name]))

        def settle(carry: list, results: list) -> None:
            for have, name in zip(carry, results):
                if have != env[name] and nbytes(name):
                    self.ctx.copy(env[name], have, nbytes(name))

        for s in steps:
            if isinstance(s, C.Run):
                self._run_launches(self.by_kernel.get(s.kernel, []), env)
            elif isinstance(s, C.Scan):
                carry = [env[n] for n in s.init]
                for i in range(s.length):
                    r = C.scan_row(s, i)
                    out = C.carry_targets(s, carry, (s.length - 1 - i) % 2 == 0, env.__getitem__)
                    run(s.body, [env[n] for n in s.consts] + carry + [row(x, r) for x in s.xs],
                        out + [row(y, r) for y in s.ys])
                    carry = out
                settle(carry, s.carry)
            elif isinstance(s, C.While):
                carry, odd = [env[n] for n in s.init], False
                consts = [env[n] for n in s.consts]
                while true(s.cond.outputs[0], run(s.cond, consts + carry)):
                    out = C.carry_targets(s, carry, not odd, env.__getitem__)
                    run(s.body, consts + carry, out)
                    carry, odd = out, not odd
                settle(carry, s.carry)
            else:
                block = s.then if true(s.pred, env) else s.orelse
                run(block, [env[n] for n in s.operands], [env[n] for n in s.results])

    def _error_record(self) -> Optional[np.ndarray]:
        """A zeroed host copy of the program's error record, or None without computed checks."""
        name = self.program.index_errors
        return None if name is None else np.zeros(tuple(self.program.buffers[name].shape), np.int64)

    def _result(self, name: str, inputs: dict, results: dict) -> DeviceArray:
        b = self.program.buffers[name]
        if name in self.program.donated:     # donation.py wrote the output into this input's memory
            return inputs[name]
        if b.role == "input":          # a copy, as the CPU backend returns
            return inputs[name].copy()
        if b.role == "constant":
            return DeviceArray.from_host(self.program.constants[name], self.ctx)
        return results[name]

    def close(self) -> None:
        """Free the device memory and unload the module (also done at garbage collection)."""
        device, self.device = getattr(self, "device", {}), {}
        try:
            for ptr in device.values():
                self.ctx.free(ptr)
            if getattr(self, "module", None) is not None:
                self.module.unload()
        except driver.CudaError:
            pass            # a dying context: nothing left to free

    def __del__(self):
        self.close()


def _loops(call) -> tuple:
    return call[1].loops


def _shape(dims, sizes: dict) -> tuple[int, ...]:
    """A buffer's shape at a call's size parameters ({"size_batch": 7}; static dims as they are)."""
    return tuple(d if isinstance(d, int) else size_value(d, sizes) for d in dims)


def _at(check, sizes: dict[str, int]):
    """An index check with its size evaluated at a call's sizes (by public name)."""
    return check if isinstance(check.size, int) else dataclasses.replace(check, size=evaluate(check.size, sizes))


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
