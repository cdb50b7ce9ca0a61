"""The host CPU as an LLVM target: target machines (for hostcpu.py's triple, CPU name and
features), the optimization pipeline and assembly output.

OPT_LEVEL (2) is the level tracecomp's CPU code is optimized and emitted at.  O2 keeps the
loop and SLP vectorizers (and interleaving) on, like O3, runs the benchmark workloads as
fast with bit-identical results, and compiles in a little over half of O3's time (the
comparison: BENCHMARKS.md, "Figures that were in the code").  Loops are unrolled only where
the code generator asks for it (llvm/loop_ids.py), not by LLVM's own cost model.

Invariants:
- llvmlite's native target, asm printer and asm parser are initialized once, on first use
  (`initialize()`), before any target machine exists;
- target machines are cached per (opt, reloc, code model): building one costs a few ms
  and they are immutable once made;
- parsing, optimizing and emitting hold `LLVM_LOCK`: a TargetMachine is not safe to drive
  from two threads at once (and llvmlite releases the GIL during these calls);
- a module compiled to object code is parsed into a context of its own (`scratch_context`)
  and freed with it: an LLVMContext keeps every type, constant and metadata node a module
  ever used until the context dies, so modules parsed into llvmlite's global context left
  ~0.2-3 KiB each behind for the life of the process (dumps still use the global one);
- `optimize` stamps the module with the machine's triple and data layout before running
  the pipeline, so the vectorizer's cost model sees the host's vector width (AVX-512 on
  Zen 5) rather than a generic target's;
- `optimize` builds a fresh PassBuilder and pipeline per module and frees the pipeline
  itself (see _dispose_pass_manager).  llvmlite 0.50 never frees the
  PassInstrumentationCallbacks its LLVMPY_CreatePassBuilder allocates (its dispose deletes
  only the builder, and the object is not reachable from Python), so ~1.5 KiB stay behind
  per optimized module; reusing one builder instead is worse: each run registers callbacks
  that capture that run's stack-allocated instrumentation, so later runs would call
  callbacks of dead objects, more of them every time.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator, Optional

import llvmlite.binding as llvm
from llvmlite.binding import newpassmanagers

from ...core.errors import BackendError
from ..hostcpu import host_target   # the target's facts (and TRACECOMP_TARGET) live in hostcpu

LLVM_LOCK = threading.RLock()
OPT_LEVEL = 2
_INIT_LOCK = threading.Lock()
_initialized = False


def initialize() -> None:
    """Initialize llvmlite's native target once per process (idempotent, thread-safe)."""
    global _initialized
    with _INIT_LOCK:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()
            _initialized = True


def host_target_machine(opt: int = OPT_LEVEL, reloc: str = "default",
                        codemodel: str = "jitdefault") -> llvm.TargetMachine:
    """A target machine for the host CPU with all its features (cached; a new one once the
    measured choices change the target's features).

    The defaults suit the JIT; an exporter of shared objects asks for reloc="pic" and
    codemodel="default"."""
    return _target_machine(host_target(), opt, reloc, codemodel)


@functools.lru_cache(maxsize=None)
def _target_machine(host, opt: int, reloc: str, codemodel: str) -> llvm.TargetMachine:
    initialize()
    target = llvm.Target.from_triple(host.triple)
    return target.create_target_machine(cpu=host.cpu, features=host.features, opt=opt,
                                        reloc=reloc, codemodel=codemodel, jit=True)


def prepare(module_ref: llvm.ModuleRef, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """Stamp `module_ref` with `tm`'s triple and data layout (in place) and verify it."""
    module_ref.triple = tm.triple
    module_ref.data_layout = str(tm.target_data)
    module_ref.verify()
    return module_ref


def optimize(module_ref: llvm.ModuleRef, tm: llvm.TargetMachine,
             opt: int = OPT_LEVEL) -> llvm.ModuleRef:
    """Run LLVM's default per-module pipeline at `opt` (from 2 on: loop and SLP
    vectorization and interleaving; unrolling where a loop asks) for `tm` over
    `module_ref`, in place."""
    prepare(module_ref, tm)
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = opt >= 2
    pto.slp_vectorization = opt >= 2
    pto.loop_interleaving = opt >= 2
    # No unrolling by LLVM's own cost model: it unrolled every short constant loop, the
    # already vectorized and interleaved ones too, and that doubled the LLVM time of W8's
    # step for no measurable speed.  Loops that gain ask for it (llvm/loop_ids.py).
    pto.loop_unrolling = False
    pass_builder = llvm.create_pass_builder(tm, pto)
    with LLVM_LOCK:
        # A fresh PassBuilder per run: llvmlite registers each run's instrumentation
        # callbacks on the builder, so a reused one slows down and grows with every module.
        pipeline = pass_builder.getModulePassManager()
        try:
            pipeline.run(module_ref, pass_builder)
        finally:
            _dispose_pass_manager(pipeline)
    return module_ref


def _dispose_pass_manager(pipeline: llvm.ModulePassManager) -> None:
    """Free a pass pipeline now.  llvmlite 0.50's ModulePassManager inherits ObjectRef's
    no-op `_dispose` ahead of NewPassManager's real one (base-class order), so without
    this every optimized module leaks its pipeline (~32 KiB)."""
    dispose = getattr(newpassmanagers.NewPassManager, "_dispose", None)
    if dispose is not None and not pipeline.closed:
        dispose(pipeline)
        pipeline.detach()


def optimized_for_host(module_text: str) -> tuple[llvm.ModuleRef, llvm.TargetMachine]:
    """(the module optimized for the host, the target machine it was optimized for).  Call it
    once the kernels are built: scheduling installs the measured choices (runtime/tuning.py),
    and a target machine built before them gets LLVM's own vector width (256-bit on Intel's
    AVX-512 CPUs) instead of theirs."""
    tm = host_target_machine()
    return optimize(parse(module_text), tm), tm


# tile instructions and the CPU features they need (a matmul path forced onto a CPU without
# them would stop LLVM's instruction selection with a fatal error, killing the process)
TILE_FEATURES = {"llvm.x86.ldtilecfg": ("amx-tile",), "llvm.x86.tdpbf16ps": ("amx-tile", "amx-bf16"),
                 "llvm.x86.tdpfp16ps": ("amx-tile", "amx-fp16")}


def check_tile_features(module_ref: llvm.ModuleRef) -> None:
    """Raise BackendError when `module_ref` uses an AMX instruction the host target lacks."""
    for fn in module_ref.functions:
        missing = [f for f in TILE_FEATURES.get(fn.name, ()) if not host_target().has(f)]
        if missing:
            raise BackendError(f"the code uses {fn.name.split('.')[-1]}, but the target CPU has no "
                               f"{', '.join(missing)}: a matmul path was forced (hostcpu.tuned()'s "
                               "matmul_half_path) that this host cannot compile for")


def emit_assembly(module_ref: llvm.ModuleRef, tm: llvm.TargetMachine) -> str:
    """The host assembly of `module_ref` (the "asm" stage), in AT&T syntax."""
    prepare(module_ref, tm)
    check_tile_features(module_ref)
    with LLVM_LOCK:
        return tm.emit_assembly(module_ref)


def emit_object(module_ref: llvm.ModuleRef, tm: llvm.TargetMachine) -> bytes:
    """The ELF object code of `module_ref` for `tm`."""
    prepare(module_ref, tm)
    check_tile_features(module_ref)
    with LLVM_LOCK:
        return tm.emit_object(module_ref)


@contextlib.contextmanager
def scratch_context() -> Iterator[llvm.ContextRef]:
    """A fresh LLVMContext, freed on exit.  Every module parsed into it must be closed
    before the block ends (a module outliving its context would free into freed memory)."""
    initialize()
    context = llvm.create_context()
    try:
        yield context
    finally:
        context.close()


def parse(llvm_ir: str, name: str = "<tracecomp>",
          context: Optional[llvm.ContextRef] = None) -> llvm.ModuleRef:
    """Parse LLVM IR text into a module (verified) of `context`, by default llvmlite's
    global one."""
    initialize()
    with LLVM_LOCK:
        module_ref = llvm.parse_assembly(llvm_ir, context=context)     # RuntimeError on malformed IR
        try:
            module_ref.name = name
            module_ref.verify()
        except BaseException:
            module_ref.close()      # now: it must not outlive a scratch context (freed when it closes)
            raise
    return module_ref
