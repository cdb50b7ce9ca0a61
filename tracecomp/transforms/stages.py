"""The stages of one signature of a tc.trace'd function (`Lowered`): the traced graph, its
backward part, the optimized graph, then, built on first use, the scheduled loops, the LLVM
module, the assembly, the PTX and the compiled program that runs it.

TracedFunction._trace (trace.py) builds a Lowered whole from a trace; `as_text(stage)`
prints a stage, `timings` gives the seconds each compile stage took (timings.py), and `run`
calls the compiled program and writes the function's in-place changes back.
"""
from __future__ import annotations

import functools
import logging

import numpy as np

from ..core import timings
from ..core.errors import ArgumentError
from ..core.symbolic import Dim
from ..ir import Graph, TensorType
from ..library.assignment import update
from ..tensors import pytree
from ..tensors.tensor import Tensor
from .closures import Reader

# the traced function's logger: compiles are logged next to its retraces (TRACECOMP_LOG)
log = logging.getLogger("tracecomp.transforms.trace")


def describe_leaf(x) -> str:
    """A signature's leaf (a tensor type) or an argument, for messages."""
    return str(x) if isinstance(x, TensorType) else repr(x)


class Lowered:
    """One signature of a traced function: its graphs, its compiled form, its stages as text.
    Built whole by TracedFunction._trace; scheduling and native compilation happen on first
    use (first call or first look).

    The graphs' outputs are the function's results, then the new values of the arguments it
    changed in place, then those of the closed-over tensors it changed in place (_trace
    appends them so); `split` separates them, and no caller slices the outputs by position
    (`result_outputs`, `write_backs`)."""

    def __init__(self, graph: Graph, optimized: Graph, out_structure, backward_ops: set, *,
                 backend: str = "cpu", device: str = "cpu", same_leaf: list[int] | None = None,
                 mutated_inputs: tuple[int, ...] = (), hidden: Reader | None = None,
                 mutated_hidden: tuple[int, ...] = (), donated_inputs: frozenset = frozenset(),
                 fastmath: tuple[str, ...] = (), check_indices: bool = True,
                 compile_times: dict[str, float] | None = None, cache_key=None, host_steps: list = ()):
        self.graph = graph
        self.host_steps = list(host_steps)          # value-dependent steps (staging.py), run between stages
        self.optimized = optimized
        self.out_structure = out_structure
        self.backward_ops = backward_ops
        self.backend = backend
        self.device = device
        self.mutated_inputs = mutated_inputs        # arguments changed in place (flattened positions)
        self.hidden = hidden                        # the closed-over tensors, inputs after the arguments
        self.read_hidden = hidden.read if hidden is not None else None    # their arrays, now
        self.mutated_hidden = mutated_hidden        # closed-over tensors changed in place (among hidden)
        self._results = len(optimized.outputs) - len(mutated_inputs) - len(mutated_hidden)
        self.writes_back = bool(mutated_inputs or mutated_hidden)
        # for each result, the first result that is the same object
        self.same_leaf = list(range(self._results)) if same_leaf is None else same_leaf
        self.donated_inputs = donated_inputs        # positions of the graph inputs the caller donated
        self.reused_inputs: dict[int, int] = {}     # output position -> donated input it was written into (program)
        self.fastmath = fastmath                    # LLVM fast-math flags of the CPU code
        self.check_indices = check_indices          # False: computed indices clamped unchecked (unsafe)
        self.compile_times = {} if compile_times is None else compile_times   # seconds per stage (timings.py)
        self.cache_key = cache_key                  # its key in the traced function's cache (None: not cached)

    def split(self, outputs: list) -> tuple[list, list, list]:
        """(results, new values of the mutated arguments, of the mutated closed-over tensors)
        of `outputs`, the graph's outputs or the arrays computed for them."""
        inputs_end = self._results + len(self.mutated_inputs)
        return outputs[:self._results], outputs[self._results:inputs_end], outputs[inputs_end:]

    @property
    def result_outputs(self) -> list:
        """The optimized graph's outputs that the function returns."""
        return self.split(self.optimized.outputs)[0]

    @property
    def write_backs(self) -> list:
        """The optimized graph's outputs that run() writes back: the mutated arguments' new
        values, then the mutated closed-over tensors'."""
        _, inputs, hidden = self.split(self.optimized.outputs)
        return inputs + hidden

    STAGES = ("graph", "backward", "optimized", "loops", "llvm", "asm", "ptx")

    @functools.cached_property
    def program(self):
        from ..lower.schedule.donation import donate
        from ..lower.schedule.scheduler import schedule
        from ..runtime.tuning import ensure_tuned
        if self.backend == "cpu":
            ensure_tuned()          # the tiles' measured choices, before anything is scheduled
        with timings.recording(self.compile_times), timings.stage("lowering"):
            program = schedule(self.optimized, self.check_indices)
            if self.donated_inputs and self.backend == "cpu":
                self.reused_inputs = donate(program, set(self.donated_inputs))
        return program

    @property
    def timings(self) -> dict[str, float]:
        """Seconds per compile stage of this signature (timings.STAGES), compiling it first if
        it was not yet: trace, autodiff, passes, lowering, llvm_opt, machine_code, jit_link."""
        if self.backend == "cpu" and self.device == "cpu":
            self.compiled
        return dict(self.compile_times)

    def _log_compile(self) -> None:
        log.info("compiled %s(%s): %s", self.graph.name, ", ".join(str(v.type) for v in self.graph.inputs),
                 timings.summary(self.compile_times))

    @functools.cached_property
    def cpu_program(self):
        """The program as the CPU runs it: loop weights packed once (schedule/prepack.py)."""
        from ..lower.schedule.prepack import prepack_loop_weights
        return prepack_loop_weights(self.program)

    @functools.cached_property
    def compiled(self):
        if self.device == "cuda":
            from ..runtime.cuda.runner import CudaProgram      # raises at once without a driver or GPU
            return CudaProgram(self.program)
        from ..runtime.compiled import CompiledProgram, DynamicProgram
        if self.host_steps:
            from .staging import StagedProgram
            with timings.recording(self.compile_times), timings.stage("lowering"):
                staged = StagedProgram(self)
            self._log_compile()
            return staged
        program = self.cpu_program
        with timings.recording(self.compile_times), timings.stage("lowering"):
            compiled = (DynamicProgram if self.dynamic else CompiledProgram)(program, self.fastmath)
        self._log_compile()
        return compiled

    @functools.cached_property
    def dynamic(self) -> bool:
        """Whether some input dims are symbolic sizes (symbolic.Dim): one program for many shapes."""
        return any(isinstance(d, Dim) for v in self.optimized.inputs for d in v.type.shape)

    @functools.cached_property
    def gpu_module(self):
        """The program as PTX for the default CUDA architecture, with its launches."""
        from ..lower.nvptx.program import compile_program
        return compile_program(self.program)

    @property
    def ptx(self) -> str:
        return self.gpu_module.ptx

    @property
    def loops(self) -> str:
        from ..lower.loops.steps_printer import print_program
        from ..lower.loops.source_notes import source_notes
        program = self.program if self.device == "cuda" else self.cpu_program
        return print_program(program, source_notes(program))

    @functools.cached_property
    def cpu_module(self):
        """The kernels' LLVM module (llvmlite.ir), as the CPU backend compiles it; built
        without compiling (a dump needs no JIT, and a dynamic trace has none)."""
        from ..lower.llvm.codegen import codegen_program
        return codegen_program(self.cpu_program, f"tc_{self.program.name}", align=None, fastmath=self.fastmath)

    def _optimized_cpu_module(self):
        """(the CPU module optimized for the host, its target machine), the kernels built first
        (target.optimized_for_host says why the order matters)."""
        from ..lower.llvm import target
        return target.optimized_for_host(str(self.cpu_module))

    @property
    def llvm(self) -> str:
        from ..lower.loops.source_notes import annotate, source_notes
        if self.device == "cuda":      # the NVPTX module the PTX comes from, optimized
            from ..lower.nvptx.target import optimized_module
            return str(optimized_module(self.gpu_module.llvm_ir))
        module, _ = self._optimized_cpu_module()
        return annotate(str(module), source_notes(self.program), ";")

    @property
    def asm(self) -> str:
        from ..lower.loops.source_notes import annotate, source_notes
        from ..lower.llvm import target
        if self.device == "cuda":      # a GPU's assembly is its PTX
            return self.ptx
        module, tm = self._optimized_cpu_module()
        text = target.emit_assembly(module, tm)
        return annotate(text, source_notes(self.program), "#" if tm.triple.startswith(("x86", "i686")) else "//")

    @property
    def backward(self) -> Graph:
        """The ops the autograd engine recorded, cut out as a function of the forward values."""
        from ..ir.subgraph import extract
        return extract(self.graph, self.backward_ops, self.graph.name + "_backward")

    def as_text(self, stage: str = "optimized") -> str:
        from ..ir.printer import print_graph
        if stage not in self.STAGES:
            raise ArgumentError(f"unknown stage {stage!r}; available: {', '.join(self.STAGES)}")
        value = getattr(self, stage)
        return value if isinstance(value, str) else print_graph(value)

    def run(self, inputs: list[np.ndarray], leaves: list | None = None, owned: tuple[bool, ...] | None = None):
        """The outputs for `inputs`, the arguments' arrays; `leaves` are the caller's arguments
        (Tensors or arrays) behind them, which receive the function's in-place changes to its
        inputs; `owned` says which of the arrays Tensors hold (the compiled program trusts
        those it checked before: CompiledProgram.__call__).  The closed-over tensors' current
        arrays follow the arguments (ClosureMoved where one is gone or changed type: tc.trace
        traces again)."""
        if self.read_hidden is not None:
            hidden = self.read_hidden()
            if self.device == "cpu" and not all(type(a) is np.ndarray for a in hidden):
                raise ArgumentError(f"{self.graph.name}: a closed-over tensor is in GPU memory, but the "
                                    f"function was traced for the cpu (closed over: "
                                    f"{', '.join(s.where for s in self.hidden.sources)}); trace it with "
                                    "device='cuda', or move the tensors back with .cpu()")
            inputs = inputs + hidden
            if owned is not None:
                owned = owned + (True,) * len(hidden)
        if self.backend == "interp":
            from ..runtime.interpreter import run_graph
            arrays = list(run_graph(self.optimized, inputs))
        elif owned is not None and getattr(self.compiled, "trusts_owned", False):
            arrays = self.compiled(inputs, owned)
        else:
            arrays = self.compiled(inputs)       # exactly the outputs' shapes and dtypes
        if self.writes_back:
            arrays, inputs, hidden = self.split(arrays)
            self._write_back(leaves, inputs)
            self._write_back_hidden(hidden)
        types = self.result_types if not self.dynamic else \
            [TensorType(a.shape, t.dtype) for a, t in zip(arrays, self.result_types)]
        if self.out_structure == pytree.LEAF:
            return Tensor(arrays[0], types[0])
        if self._repeated:
            return pytree.unflatten(self.out_structure, self._distinct(arrays, types))
        return pytree.unflatten(self.out_structure, [Tensor(a, t) for a, t in zip(arrays, types)])

    def runner(self, owned: tuple[bool, ...]):
        """run(inputs, leaves) for one call signature's fast path (TracedFunction.__call__),
        bound once: where the function returns one tensor from a compiled CPU program, closes
        over nothing and writes nothing back, the call is the program's and a Tensor, without
        run()'s per-call questions (about 0.5 us of W6's call)."""
        if self.read_hidden is not None or self.writes_back or self.dynamic or self.backend != "cpu" \
                or self.out_structure != pytree.LEAF or not getattr(self.compiled, "trusts_owned", False):
            return lambda inputs, leaves: self.run(inputs, leaves, owned)
        compiled, result_type = self.compiled, self.result_types[0]
        return lambda inputs, leaves: Tensor(compiled(inputs, owned)[0], result_type)

    def _write_back(self, leaves: list, arrays: list[np.ndarray]) -> None:
        """What eager would have left in the caller's arguments the function assigned into:
        a Tensor takes the new value over (as an in-place op, so a leaf that requires grad
        refuses, and a view made by indexing writes into its base); an array is overwritten."""
        for i, a in zip(self.mutated_inputs, arrays):
            leaf = leaves[i]
            if isinstance(leaf, Tensor):
                update(leaf, Tensor(a, leaf._type), f"in-place change of argument {i} inside tc.trace")
            else:
                try:
                    np.copyto(leaf, a, casting="unsafe")
                except (TypeError, ValueError) as e:
                    raise ArgumentError(f"tc.trace: the function changes argument {i} in place, but "
                                        f"that argument ({describe_leaf(leaf)}) cannot be written: {e}") from e

    def _write_back_hidden(self, arrays: list[np.ndarray]) -> None:
        """The function's in-place changes to the tensors it closes over (a BatchNorm's running
        statistics in training mode), made on the tensors the sources reach now."""
        if not arrays:
            return
        tensors = self.hidden.tensors()
        for i, a in zip(self.mutated_hidden, arrays):
            t = tensors[i]
            update(t, Tensor(a, t._type), f"in-place change of closed-over tensor "
                                          f"{self.hidden.sources[i].where} inside tc.trace")

    def _distinct(self, arrays: list[np.ndarray], types: list[TensorType]) -> list[Tensor]:
        """The outputs as Tensors when some output Value repeats: an output the passes merged
        into an earlier one (CSE of `(x * 2, x * 2)`) though the function returned two
        objects gets its own copy, as eager gives two tensors; the same object returned
        twice comes back as the same Tensor twice, as eager."""
        out: list[Tensor] = []
        for i, (a, t) in enumerate(zip(arrays, types)):
            j = self.same_leaf[i]
            if j != i:
                out.append(out[j])
            else:
                out.append(Tensor(a.copy() if i in self._merged_outputs else a, t))
        return out

    @functools.cached_property
    def _repeated(self) -> bool:
        outputs = self.result_outputs
        return len(set(outputs)) != len(outputs)

    @functools.cached_property
    def result_types(self) -> list[TensorType]:
        """The types of the function's results, flattened."""
        return [v.type for v in self.result_outputs]

    @functools.cached_property
    def _merged_outputs(self) -> list[int]:
        """Outputs that are an earlier output's Value though the function returned another
        object (see _distinct)."""
        outputs, first = self.result_outputs, {}
        merged = []
        for i, v in enumerate(outputs):
            if first.setdefault(v, i) != i and self.same_leaf[i] == i:
                merged.append(i)
        return merged
