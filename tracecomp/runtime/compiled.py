"""A scheduled Program compiled to native code, with the fast call path.

Built once per traced signature: the kernels are generated into one LLVM module and JIT
compiled into their own library (freed with this object), or their object code comes from
the on-disk compile cache (cache.py; `module` is then generated only if asked for);
temporaries get a workspace that is planned by liveness and kept across calls; constants
are copied once into aligned memory.  A call checks the inputs (shape, dtype, index
ranges of index inputs) before any pointer reaches native code, allocates fresh aligned
outputs (except those donation.py placed in donated inputs), and runs the kernels in order;
then, where the program computes indices, it reads the flag of the kernels' error record
(loops/ir.py's CheckedIndex) and raises the ShapeError of the first failed check, after
clearing the record for the next call.
The call path is prepared at compile time: per call it builds one list of data pointers
(inputs, fresh outputs, then the fixed buffers' pointers computed once) and each kernel
takes its arguments from it by position.  Inputs that are exact, C-contiguous ndarrays of
the right shape and dtype, with no values to check and not donated, skip check_inputs.
Not re-entrant: one compiled function must not run in two threads at once (shared workspace).

Loops and branches (Program.steps): the kernels' library is compiled as for any program,
and a driver, one more native function (llvm/control.py), runs the steps: the kernel
calls, the loops around them and the branches, so a scan of 10,000 steps is one ctypes
call.  It takes the call's pointer list as an array and a table of the kernels' addresses
(built once: the driver is a module of its own, so the kernels' library and its cache
entry stay what they are for any program; the driver's object code has a cache entry of
its own, keyed by its LLVM IR, which names no kernel).  A program without control flow
whose kernels take more than DIRECT_POINTERS pointers in all runs in one native call too,
through the plan runner (llvm/control.py: one function for every program, compiled once
per process), which reads the kernels' addresses and argument positions from a plan built
here: ctypes converts each argument it passes (about 0.1 us), while the pointers reach the
runner in one array that the call fills with struct.pack_into (the fixed buffers' are
written once).  With fewer pointers, one ctypes call per kernel is cheaper.  The drivers
take their pointers the same way.

Dynamic sizes (tc.trace(dynamic=...): buffer shapes that hold size parameters): a
`DynamicProgram` compiles the kernels as above (they take the sizes as trailing arguments)
and runs them through the entry point tc.export writes into a library
(lower/llvm/entry_point.py build_jit_module), its own small JIT module that calls the
kernels through the table of their addresses, places the temps in a block large enough for
the sizes of the call (the last call's, kept while it suffices), and returns an error
code.  Per call, the sizes come from the input
shapes (entry_sizes.ShapeEquations: a mismatch names the input, axis, expected and actual
size) and the outputs are allocated at the shapes they give.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import operator
import struct
import threading
import weakref

import numpy as np

from ..core.errors import ArgumentError, BackendError
from ..core.symbolic import DynamicShapeError, evaluate
from ..lower.llvm.codegen import codegen_kernels
from ..lower.schedule.index_checks import recorded_error
from ..lower.schedule.scheduler import Program
from ..core import random as tc_random
from .cache import compile_kernels
from ..lower.schedule.workspace import buffer_nbytes, plan_program
from .memory import (ALIGN, SMALL_BYTES, BlockCache, aligned_empty, aligned_empty_at, data_pointer,
                     output_blocks, output_empty_at)


_NOTHING = object()

# Pointers, in all, up to which a program's kernels take them as ctypes arguments (measured:
# 8 arguments cost about as much as one array of them, 31 arguments 1.8x, 301 2.6x); the
# plan runner calls kernels of at most MAX_ARITY (more: ctypes calls each kernel)
DIRECT_POINTERS, MAX_ARITY = 8, 32
# Inputs up to which __call__ looks at each in a plain loop rather than skip those checked
# before in one pass at C speed (~0.35 us whatever the count; the loop ~70 ns an input)
FEW_INPUTS = 4


def check_indices(a: np.ndarray, checks) -> None:
    """Index values must lie in [0, size) of the dim they index ([-size, size) where the graph
    wraps negative ones), as eager execution demands."""
    lo, hi = int(a.min()), int(a.max())
    for c in checks:
        least = -c.size if c.wraps else 0
        if lo < least or hi >= c.size:
            out = (a < least) | (a >= c.size)
            if c.allowed is not None:
                out &= a != c.allowed             # an ignore_index the graph maps away
            if not out.any():
                continue
            raise c.error(int(a[out].flat[0]))


class CompiledProgram:
    def __init__(self, program: Program, fastmath: tuple[str, ...] = ()):
        self.program = program
        self.fastmath = fastmath          # LLVM fast-math flags (llvm.codegen.fastmath_flags)
        # No alignment promise on pointers: NumPy hands us 16-byte aligned arrays, and copying
        # them to 64-byte alignment costs a full pass over memory, while unaligned vector loads
        # cost next to nothing on current x86 cores. Our own buffers are 64-byte aligned anyway.
        self.library = compile_kernels(program.kernels, self._module_name, align=None, fastmath=fastmath)
        self._lock = threading.Lock()
        self._fixed: dict[str, np.ndarray] = {}       # temps (workspace views) and constants
        self._plan_workspace()
        self._errors = None                            # the error record of computed index checks
        if program.index_errors is not None:
            b = program.buffers[program.index_errors]
            self._errors = aligned_empty(b.shape, np.int64)
            self._errors[...] = 0
            self._fixed[program.index_errors] = self._errors
        for name, value in program.constants.items():
            arr = aligned_empty(value.shape, value.dtype)
            arr[...] = value
            self._fixed[name] = arr
        self._prepare_calls()

    @property
    def _module_name(self) -> str:
        return f"tc_{self.program.name}"

    @functools.cached_property
    def module(self):
        """The kernels' LLVM module (llvmlite.ir), as compiled into `library`."""
        return codegen_kernels(self.program.kernels, self._module_name, align=None, fastmath=self.fastmath)

    def _plan_workspace(self) -> None:
        assignment, sizes = plan_program(self.program)
        slots = [aligned_empty((s,), np.uint8) for s in sizes]
        for name, slot in assignment.items():
            b = self.program.buffers[name]
            self._fixed[name] = slots[slot][:buffer_nbytes(b)].view(b.dtype.np).reshape(b.shape)
        self.workspace_bytes = sum(sizes)

    def _prepare_calls(self) -> None:
        """Argument marshalling fixed at compile time.  Per call, a list of data pointers:
        the inputs, then the fresh outputs, then the fixed buffers (workspace, constants),
        whose pointers never change; each kernel takes its arguments from it by position."""
        p = self.program
        self._outputs = [n for n, b in p.buffers.items() if b.role == "output"]
        # per fresh output: its shape, dtype and the bytes of raw memory that hold it 64-byte aligned
        self._output_specs = [(tuple(p.buffers[n].shape), np.dtype(p.buffers[n].dtype.np),
                               buffer_nbytes(p.buffers[n]) + ALIGN) for n in self._outputs]
        self._input_specs = [(tuple(p.buffers[n].shape), p.buffers[n].dtype.np,
                              p.buffers[n].dtype.np.itemsize, n in p.index_checks or n in p.donated)
                             for n in p.inputs]
        # per input: a weak reference to the owned array checked there last (`__call__`), or
        # a callable that returns an object no input is, and that array's address
        self._checked = [itertools.repeat(_NOTHING).__next__] * len(p.inputs)
        self._checked_pointers = [0] * len(p.inputs)
        fixed = list(self._fixed)
        self._fixed_pointers = [data_pointer(self._fixed[n]) for n in fixed]
        position = {n: i for i, n in enumerate(list(p.inputs) + self._outputs + fixed)}
        self._calls = []
        self._run_driver = None
        variable = len(p.inputs) + len(self._outputs)
        if p.steps is not None:
            self._run_driver = self._driver(position, variable)
        elif sum(len(k.buffers) for k in p.kernels) > DIRECT_POINTERS and \
                max(len(k.buffers) for k in p.kernels) <= MAX_ARITY:
            self._run_driver = self._planned(position, variable)
        for k in p.kernels if self._run_driver is None else ():
            fn = self.library.function(k.name, None, *([ctypes.c_void_p] * len(k.buffers)))
            positions = [position[b.name] for b in k.buffers]
            # itemgetter picks a kernel's pointers as one tuple (of one, for a single buffer)
            pick = operator.itemgetter(*positions) if len(positions) > 1 else \
                (lambda pointers, i=positions[0]: (pointers[i],))
            self._calls.append((fn, pick))
        # each result: ("new", j) the j-th fresh output, ("in", i) input i written in place
        # (donation), ("copy", array) a copy of an input or fixed buffer returned as is
        # each random fill: (fill, j) into the j-th fresh output, or (fill, the fixed temp)
        self._fills = [(f, self._outputs.index(f.buffer) if f.buffer in self._outputs else self._fixed[f.buffer])
                       for f in p.fills]
        self._results = []
        self._plain_results = p.outputs == self._outputs     # the fresh outputs, in order
        # kernels that touch no memory kept between calls (workspace, constants, error record,
        # a driver's pointer array) and return their fresh outputs need no lock
        self._unshared = not self._fixed and not self._fills and self._run_driver is None and self._plain_results
        for name in p.outputs:
            if name in self._outputs:
                self._results.append(("new", self._outputs.index(name)))
            elif name in p.donated:
                self._results.append(("in", p.inputs.index(name)))
            else:
                self._results.append(("copy", p.inputs.index(name) if name in p.inputs else self._fixed[name]))

    def _driver(self, position: dict[str, int], variable: int):
        """run(pointers): the program's steps in one native call (_one_call)."""
        import llvmlite.ir as lir
        from ..lower.llvm.control import driver_function, table_call
        p = self.program
        module = lir.Module(name=f"{self._module_name}_driver")
        name = f"{self._module_name}_driver"
        driver_function(module, p, name, position, table_call({k.name: i for i, k in enumerate(p.kernels)}))
        self._driver_library = _compile_cached(module)
        fn = self._driver_library.function(name, None, ctypes.c_void_p, ctypes.c_void_p)
        table = (ctypes.c_void_p * max(1, len(p.kernels)))(*[self.library.address(k.name) for k in p.kernels])
        return self._one_call(fn, variable, table)

    def _planned(self, position: dict[str, int], variable: int):
        """run(pointers): the kernels in one call of the plan runner (_one_call)."""
        words = [len(self.program.kernels)]
        for k in self.program.kernels:
            words += [self.library.address(k.name), len(k.buffers), *[position[b.name] for b in k.buffers]]
        return self._one_call(_plan_runner()[1], variable, (ctypes.c_uint64 * len(words))(*words))

    def _one_call(self, fn, variable: int, table):
        """run(pointers): fn(buffers, table), where `buffers` is the _pointer_array of the
        call's inputs and fresh outputs (the first `variable`) and the fixed buffers."""
        array, address, pack = _pointer_array(variable, self._fixed_pointers)
        self._native_arrays = table, array             # (kept alive with the function)
        table = ctypes.addressof(table)

        def run(pointers):
            pack(array, 0, *pointers)
            fn(address, table)
        return run

    def check_inputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Inputs ready for native code: right shape and dtype (else ArgumentError), C-contiguous
        and element-aligned (else copied), index values in range; donated inputs writable and
        sharing no memory with another input (else copied: nothing else may see the writes)."""
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
            if not a.flags.c_contiguous or data_pointer(a) % a.dtype.itemsize or \
                    name in p.donated and (not a.flags.writeable or _overlaps_another(a, i, inputs)):
                copy = aligned_empty(a.shape, a.dtype)
                copy[...] = a
                a = copy
            if name in p.index_checks and a.size:
                check_indices(a, p.index_checks[name])
            ready.append(a)
        return ready

    trusts_owned = True         # Lowered.run passes which inputs Tensors own

    def __call__(self, inputs: list[np.ndarray], owned: tuple[bool, ...] | None = None) -> list[np.ndarray]:
        """Run the program; the fast path takes inputs that need neither a copy nor a check of
        their values, the others go through check_inputs.  An input that `owned` marks as a
        Tensor's array is checked once: while the same array comes back at its position (a
        model's parameters, closed-over tensors) its pointer is reused, found by one pass at
        C speed.  (A Tensor's array never changes shape, dtype, layout or address in place:
        NumPy refuses to resize an array others reference.)"""
        specs = self._input_specs
        pointers = None
        if len(inputs) == len(specs):
            pointers = self._checked_pointers.copy()
            checked = self._checked
            # the inputs not checked before: a pass at C speed where there are many, a plain
            # loop where there are few (the pass costs ~0.35 us whatever the count)
            for i in range(len(specs)) if len(specs) <= FEW_INPUTS else \
                    itertools.compress(range(len(specs)), map(operator.is_not, inputs, map(operator.call, checked))):
                a = inputs[i]
                if a is checked[i]():
                    continue
                shape, dtype, itemsize, slow = specs[i]
                if type(a) is not np.ndarray or slow or a.shape != shape or a.dtype != dtype \
                        or not a.flags.c_contiguous:
                    pointers = None
                    break
                pointer = pointers[i] = data_pointer(a)
                if pointer % itemsize:
                    pointers = None
                    break
                if owned is not None and owned[i]:
                    checked[i], self._checked_pointers[i] = weakref.ref(a), pointer
        if pointers is None:
            inputs = self.check_inputs(inputs)
            pointers = [data_pointer(a) for a in inputs]
        outs = []
        for shape, dtype, raw_bytes in self._output_specs:     # memory.output_empty_at, inlined
            if raw_bytes >= BlockCache.MIN_BYTES:
                out, pointer = output_blocks.empty_at(shape, dtype, raw_bytes)
                outs.append(out)
                pointers.append(pointer)
                continue
            if raw_bytes < SMALL_BYTES:
                out = np.empty(shape, dtype)
                outs.append(out)
                pointers.append(data_pointer(out))
                continue
            raw = np.empty(raw_bytes, np.uint8)
            base = data_pointer(raw)
            start = -base % ALIGN
            outs.append(np.ndarray(shape, dtype, raw, start))
            pointers.append(base + start)
        if self._unshared:
            for fn, pick in self._calls:
                fn(*pick(pointers))
            return outs
        with self._lock:
            for f, target in self._fills:
                gen = tc_random.generator()
                draw = gen.random if f.impl == "uniform" else gen.standard_normal
                (outs[target] if isinstance(target, int) else target)[...] = draw(f.shape, dtype=f.dtype.np)
            if self._run_driver is not None:
                self._run_driver(pointers)
            else:
                pointers += self._fixed_pointers
                for fn, pick in self._calls:
                    fn(*pick(pointers))
            if self._errors is not None and self._errors[0]:
                self._raise_index_error()
            if self._plain_results:
                return outs
            return [outs[what] if kind == "new" else inputs[what] if kind == "in"
                    else np.array(inputs[what] if isinstance(what, int) else what, copy=True)
                    for kind, what in self._results]

    def _raise_index_error(self):
        """Raise the first failed computed-index check, clearing the record first."""
        err = recorded_error(self.program.computed_checks, self._errors)
        self._errors[...] = 0
        raise err


class DynamicProgram:
    """A Program with dynamic sizes, run through its entry point (the module docstring)."""

    def __init__(self, program: Program, fastmath: tuple[str, ...] = (), least_size: int = 1):
        from ..lower.llvm.entry_checks import add_computed_checks
        from ..lower.llvm.entry_point import build_jit_module
        from ..lower.llvm.entry_sizes import ShapeEquations, public_name, size_names
        from ..lower.loops.index import symbolic
        p = self.program = program
        if p.fills:
            raise DynamicShapeError("random draws (rand, randn, dropout) take static shapes only")
        self.fastmath = fastmath
        self.library = compile_kernels(p.kernels, f"tc_{p.name}", align=None, fastmath=fastmath)
        name = f"tc_{p.name}_entry"
        self.least_size = least_size        # 0 where sizes are counts (transforms/staging.py)
        self._entry_library = _compile_cached(build_jit_module(p, name, least_size))
        self._sizes = [public_name(n) for n in size_names(p)]
        self._entry = self._entry_library.function(name, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                                   ctypes.c_void_p, *[ctypes.c_int64] * len(self._sizes))
        self._error_string = self._entry_library.function(f"{name}_error_string", ctypes.c_char_p, ctypes.c_int)
        self._error_index = self._entry_library.function(f"{name}_error_index", ctypes.c_int64)
        # the workspace the entry point keeps between calls, freed with the program (the
        # ctypes function holds the library, so its code is still there)
        self.release_workspace = self._entry_library.function(f"{name}_release", None)
        weakref.finalize(self, self.release_workspace)
        self._table = (ctypes.c_void_p * max(1, len(p.kernels)))(*[self.library.address(k.name) for k in p.kernels])
        self._equations = ShapeEquations([p.buffers[n].shape for n in p.inputs],
                                         [f"@{p.name}: input {i}" for i in range(len(p.inputs))])
        self._dtypes = [p.buffers[n].dtype.np for n in p.inputs]
        self._outputs = [([symbolic(d) for d in p.buffers[n].shape], np.dtype(p.buffers[n].dtype.np)) for n in p.outputs]
        self._constants = []                        # in aligned memory, their pointers after the inputs'
        for cname, value in p.constants.items():
            arr = aligned_empty(value.shape, value.dtype)
            arr[...] = value
            self._constants.append(arr)
        # the entry point's pointer arrays: the inputs' (then the constants') and the outputs'
        self._in_array, self._in_address, self._pack_in = _pointer_array(
            len(p.inputs), [data_pointer(a) for a in self._constants])
        self._out_array, self._out_address, self._pack_out = _pointer_array(len(self._outputs))
        self._checks = {i: p.index_checks[n] for i, n in enumerate(p.inputs) if n in p.index_checks}
        self._metadata: dict = {}
        add_computed_checks(self._metadata, p)
        self._lock = threading.Lock()

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self._dtypes):
            raise ArgumentError(f"compiled function @{self.program.name} takes {len(self._dtypes)} inputs, "
                                f"got {len(inputs)}")
        sizes = self._equations.bind([np.shape(a) for a in inputs], self.least_size)
        ready, pointers = [], []            # (ready: the arrays the pointers point into, kept alive)
        for i, (a, dtype) in enumerate(zip(inputs, self._dtypes)):
            a = np.asarray(a)
            if a.dtype != dtype:
                raise ArgumentError(f"@{self.program.name}: input {i} must be {np.dtype(dtype)}, got {a.dtype}")
            pointer = data_pointer(a)
            if not a.flags.c_contiguous or pointer % a.dtype.itemsize:
                a, pointer = aligned_empty_at(a.shape, a.dtype)
                a[...] = inputs[i]
            if i in self._checks and a.size:
                check_indices(a, [dataclasses.replace(c, size=evaluate(c.size, sizes)) for c in self._checks[i]])
            ready.append(a)
            pointers.append(pointer)
        outs, out_pointers = [], []
        for shape, dtype in self._outputs:
            out, pointer = output_empty_at(tuple(evaluate(d, sizes) for d in shape), dtype)
            outs.append(out)
            out_pointers.append(pointer)
        with self._lock:          # a workspace of static size is one global: one call at a time
            self._pack_in(self._in_array, 0, *pointers)
            self._pack_out(self._out_array, 0, *out_pointers)
            code = self._entry(self._in_address, self._out_address, self._table, *[sizes[n] for n in self._sizes])
            if code:
                raise self._failure(code, sizes)
        return outs

    def _failure(self, code: int, sizes: dict) -> Exception:
        from ..lower.llvm.entry_checks import computed_index_error
        from ..lower.llvm.entry_point import ERR_ALLOC
        error = computed_index_error(self._metadata, code, int(self._error_index()), sizes)
        if error is not None:
            return error
        text = self._error_string(code).decode()
        if code == ERR_ALLOC:
            return MemoryError(f"@{self.program.name}: {text} ({sizes})")
        return BackendError(f"@{self.program.name} failed with error {code}: {text} ({sizes})")


def _pointer_array(variable: int, fixed: list[int] = ()) -> tuple:
    """(array, its address, pack): a persistent array of `variable` pointers that each call
    writes with pack(array, 0, *pointers) (struct.pack_into: no ctypes conversion per
    pointer), then the `fixed` ones, written here once."""
    array = (ctypes.c_uint64 * max(1, variable + len(fixed)))(*[0] * variable, *fixed)
    return array, ctypes.addressof(array), struct.Struct(f"{variable}Q").pack_into


@functools.lru_cache(maxsize=None)
def _plan_runner():
    """The plan runner (llvm/control.py), compiled once per process (its object code cached)."""
    from ..lower.llvm.control import plan_runner
    library = _compile_cached(plan_runner("tracecomp_run_plan", MAX_ARITY), "tracecomp_plan_runner",
                              glue=True)     # (at -O3: 340 ms, at -O0: 25 ms)
    return library, library.function("tracecomp_run_plan", None, ctypes.c_void_p, ctypes.c_void_p)


def _compile_cached(module, name: str | None = None, glue: bool = False):
    """The driver module (or a dynamic program's entry point; or IR text, named `name`) as a
    JIT library, its object code from the compile cache when an entry matches (cache.py's
    key, with the IR as the code), else compiled (jit's compile_object, `glue` passed on)
    and stored."""
    from . import cache, jit
    engine = jit.default_engine()
    settings = cache.settings
    disk = cache.DiskCache.open(settings.directory) if settings.enabled else None
    if disk is None:
        return engine.add_code(engine.compile_object(module, glue=glue))
    parts = cache.key_parts([], module.name if name is None else name, align=None,
                            texts=[str(module), f"glue={glue}"])
    key = parts.digest()
    try:
        code = disk.load(key)
    except (cache.CorruptEntry, OSError):
        settings.stats.rejected += 1
        code = None
    if code is not None:
        settings.stats.hits += 1
        return engine.add_code(code)
    settings.stats.misses += 1
    code = engine.compile_object(module, glue=glue)
    try:
        settings.stats.evicted += disk.store(key, code, parts, settings.max_bytes)
        settings.stats.stores += 1
    except OSError:
        pass                    # (a cache that cannot be written never fails a compile)
    return engine.add_code(code)


def _overlaps_another(a: np.ndarray, i: int, inputs: list) -> bool:
    """Whether input `i` shares memory with another input (then it cannot be written)."""
    return any(j != i and np.shares_memory(a, np.asarray(other)) for j, other in enumerate(inputs))
