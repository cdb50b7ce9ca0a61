"""The JIT: LLVM modules to callable machine code through llvmlite's LLJIT (OrcJIT).

Each compiled module becomes its own JIT library (a uniquely named JITDylib) owned by a
`JitLibrary`; when the last reference to that object goes, llvmlite's ResourceTracker
frees the library's code and data.  No C compiler runs at JIT time: the module is
optimized by target.optimize (at target.OPT_LEVEL), turned into an `ObjectCode` by the host
target machine, and linked in memory.  The two halves are separate (`compile_object`,
`add_object`) so that object code can come from the on-disk cache (cache.py) instead.

Invariants:
- a function pointer from a library is valid only while its `JitLibrary` lives; the
  ctypes functions `JitLibrary.function` returns hold a reference to it;
- one LLJIT instance serves at most `libraries_per_jit` libraries, then a fresh one takes
  over.  llvmlite frees a library's code but never removes the emptied JITDylib from its
  session (~9 KiB each), so a long-lived LLJIT would grow without bound over thousands of
  compiles; a retired LLJIT is freed with all its JITDylibs once its last library dies.
  32 a JIT: a fresh LLJIT costs ~1.3 ms and ~110 KiB (~40 us a library), and a retired
  one that a live library pins keeps at most 31 emptied JITDylibs (256 kept up to ~2.3 MiB);
- libraries resolve external symbols in the current process and in the system libraries
  loaded with `load_system_library` (libm always, libgomp for parallel loops); a process
  forked after libgomp was loaded runs parallel loops on one thread (libgomp is not
  fork-safe), and libgomp's idle threads spin briefly (GOMP_SPINCOUNT) before sleeping;
- linking code that uses libgomp also hands the jobs of the OpenBLAS copies loaded by then
  (NumPy's, SciPy's) to libgomp's team (blas_team.py), so that one pool serves the process;
- every failure (bad IR, a symbol no library defines) is a BackendError, never a crash.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import os
import threading
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

import llvmlite.binding as llvm
import llvmlite.ir as lir

from ..core import timings
from ..core.errors import BackendError
from . import blas_team
from ..lower.llvm import target

ModuleLike = Union[lir.Module, llvm.ModuleRef, str]

# Libraries a module needs when it references one of these symbol prefixes.
_SYSTEM_LIBRARIES = {"GOMP_": "gomp", "omp_": "gomp"}
_loaded_libraries: dict[str, str] = {}
_PROCESS = ctypes.CDLL(None)        # dlsym over everything the process has loaded globally
_load_lock = threading.Lock()


def load_lock() -> threading.Lock:
    """The lock load_system_library holds (compile_worker forks under it)."""
    return _load_lock


def load_system_library(name: str) -> str:
    """Make the symbols of system library `name` ("gomp") visible to JIT code, once;
    returns its file name.  BackendError if the library is not installed."""
    with _load_lock:
        if name not in _loaded_libraries:
            path = ctypes.util.find_library(name)
            if path is None:
                raise BackendError(f"the system library lib{name} is not installed, but compiled "
                                   f"code needs it (e.g. apt-get install lib{name}1)")
            try:
                with _gomp_settings() if name == "gomp" else contextlib.nullcontext():
                    llvm.load_library_permanently(path)
            except RuntimeError as e:
                raise BackendError(f"cannot load lib{name} ({path}): {e}") from None
            if name == "gomp":
                _single_thread_in_forked_children(path)
            _loaded_libraries[name] = path
        return _loaded_libraries[name]


# libgomp's idle worker threads spin this many times before they sleep (its default,
# 300000 with no wait policy set, is hundreds of microseconds).  While other processes or
# NumPy's BLAS threads share the cores, spinning workers take the CPU from the thread that
# has the work: W4's step took 60 ms instead of 2 with two busy processes beside it on the
# 2-core VM, 6 ms with 10000, at no cost on a quiet machine (BENCHMARKS.md, "Spinning").
GOMP_SPINCOUNT = "10000"


@contextlib.contextmanager
def _gomp_settings():
    """libgomp reads its settings from the environment once, as it loads: set the spin
    count for that moment only (unless the user chose a wait policy or spin count), so
    that no other library or child process sees it."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT
    try:
        yield
    finally:
        del os.environ["GOMP_SPINCOUNT"]


@contextlib.contextmanager
def one_thread():
    """Inside: parallel regions the calling thread starts run on it alone (OpenMP's
    nthreads for this thread set to 1, then put back)."""
    gomp = ctypes.CDLL(load_system_library("gomp"))
    gomp.omp_get_max_threads.restype = ctypes.c_int
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(1)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)


def _single_thread_in_forked_children(libgomp_path: str) -> None:
    """libgomp is not fork-safe: a child that starts a parallel region on the thread that
    forked (whose worker threads did not survive the fork) waits for them forever.  In the
    child, one thread: compiled kernels then take their serial path (llvm/parallel.py)."""
    set_num_threads = ctypes.CDLL(libgomp_path).omp_set_num_threads
    set_num_threads.argtypes = [ctypes.c_int]
    os.register_at_fork(after_in_child=lambda: set_num_threads(1))


@dataclass(frozen=True)
class ObjectCode:
    """A compiled module: host ELF object code, the functions to export from it, and the
    system libraries (names in SYSTEM_LIBRARY_NAMES) it calls into.  A module compiled in
    parts (compile_worker.py) is several ELF objects back to back: `object_sizes` gives
    their sizes (empty: one object)."""
    object: bytes
    exports: tuple[str, ...]
    system_libraries: tuple[str, ...] = ()
    object_sizes: tuple[int, ...] = ()

    def objects(self) -> list[bytes]:
        """The ELF objects, in order."""
        if not self.object_sizes:
            return [self.object]
        if sum(self.object_sizes) != len(self.object) or min(self.object_sizes) <= 0:
            raise BackendError(f"object code of {len(self.object)} bytes cannot hold objects "
                               f"of {list(self.object_sizes)} bytes")
        starts = itertools.accumulate(self.object_sizes, initial=0)
        return [self.object[a:a + n] for a, n in zip(starts, self.object_sizes)]

    @staticmethod
    def joined(parts: Sequence["ObjectCode"]) -> "ObjectCode":
        """One ObjectCode of several (their objects linked together into one library)."""
        objects = [obj for part in parts for obj in part.objects()]
        exports = tuple(e for part in parts for e in part.exports)
        libraries = tuple(sorted({lib for part in parts for lib in part.system_libraries}))
        sizes = tuple(len(o) for o in objects) if len(objects) > 1 else ()
        return ObjectCode(b"".join(objects), exports, libraries, sizes)


SYSTEM_LIBRARY_NAMES = frozenset({"m", *_SYSTEM_LIBRARIES.values()})


class JitLibrary:
    """Machine code of one module, alive as long as this object (or a function from it)."""

    def __init__(self, name: str, tracker: llvm.ResourceTracker, lljit: llvm.LLJIT,
                 symbols: Iterable[str], aliases: Optional[dict[str, str]] = None):
        self.name = name
        self.symbols = tuple(symbols)
        self.aliases = dict(aliases or {})      # a name asked for -> the symbol that holds it
        self._tracker = tracker      # dropping it unloads the code
        self._lljit = lljit          # the LLJIT that owns the JITDylib outlives it

    def address(self, symbol: str) -> int:
        symbol = self.aliases.get(symbol, symbol)
        if symbol not in self.symbols:
            raise BackendError(f"JIT library '{self.name}' exports no symbol '{symbol}' "
                               f"(exports: {', '.join(self.symbols) or 'none'})")
        return self._tracker[symbol]

    def function(self, symbol: str, restype, *argtypes) -> ctypes._CFuncPtr:
        """A ctypes function calling `symbol` with the C ABI (it keeps this library alive)."""
        fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(symbol))
        fn._tracecomp_library = self
        return fn

    def __repr__(self) -> str:
        return f"<JitLibrary {self.name}: {', '.join(self.symbols)}>"


class JitEngine:
    """Compiles modules into JitLibraries for the host (or a given target machine)."""

    def __init__(self, tm: Optional[llvm.TargetMachine] = None, libraries_per_jit: int = 32):
        self._tm = tm
        self.libraries_per_jit = libraries_per_jit
        self._lock = threading.Lock()
        self._names = itertools.count()
        self._lljit: Optional[llvm.LLJIT] = None
        self._linked = 0
        load_system_library("m")     # libm for erf/expm1/...: Python may have it only locally

    @property
    def tm(self) -> llvm.TargetMachine:
        """The given machine, or the host's as it is now (the measured choices of
        runtime/tuning.py change its features once, before anything is scheduled)."""
        return self._tm if self._tm is not None else target.host_target_machine(target.OPT_LEVEL)

    def compile(self, module: ModuleLike, exports: Optional[Iterable[str]] = None, *,
                opt: int = target.OPT_LEVEL) -> JitLibrary:
        """Optimize `module` at `opt` and link it; exports default to its defined external
        functions."""
        code = self.compile_object(module, exports, opt=opt)
        return self.add_code(code)

    def compile_object(self, module: ModuleLike, exports: Optional[Iterable[str]] = None, *,
                       opt: int = target.OPT_LEVEL, defined_elsewhere: Iterable[str] = (),
                       glue: bool = False) -> ObjectCode:
        """Optimize `module` at `opt` and emit its object code for this engine's machine.
        `defined_elsewhere`: functions it calls that another object of its library defines.
        `glue`: code that only calls kernels, compiled fast: no optimization (opt 0) and the
        host's machine at codegen level 0."""
        tm = target.host_target_machine(0) if glue and self._tm is None else self.tm
        opt = 0 if glue else opt
        # One module through parse, passes and codegen at a time; parsed into a context of
        # its own, freed with it (target.scratch_context: the global one only grows).
        with target.LLVM_LOCK, target.scratch_context() as context:
            module_ref = as_module_ref(module, context)
            try:
                with timings.stage("llvm_opt"):
                    target.optimize(module_ref, tm, opt)
                exports = _exported_functions(module_ref) if exports is None else list(exports)
                libraries = sorted(_needed_system_libraries(module_ref))
                for lib in libraries:
                    load_system_library(lib)
                _check_external_symbols(module_ref, frozenset(defined_elsewhere))
                with timings.stage("machine_code"):
                    obj = target.emit_object(module_ref, tm)
            finally:
                if module_ref is not module:      # ours, in `context`: freed before it
                    module_ref.close()
        return ObjectCode(obj, tuple(exports), tuple(libraries))

    def add_code(self, code: ObjectCode, aliases: Optional[dict[str, str]] = None) -> JitLibrary:
        """Link compiled code (all its objects) into a new library; `aliases` maps names to
        ask for to the exported symbols that hold them (cached code compiled under other names)."""
        return self.add_object(code.objects(), code.exports, code.system_libraries, aliases)

    def add_object(self, obj: Union[bytes, Sequence[bytes]], exports: Iterable[str],
                   system_libraries: Iterable[str] = (), aliases: Optional[dict[str, str]] = None) -> JitLibrary:
        """Link host object code (from `target.emit_object`; or a list of objects, linked
        together) into a new library, after loading the system libraries (names in
        SYSTEM_LIBRARY_NAMES) it calls into."""
        objects = [obj] if isinstance(obj, (bytes, bytearray)) else list(obj)
        exports = list(exports)
        for lib in system_libraries:
            if lib not in SYSTEM_LIBRARY_NAMES:
                raise BackendError(f"object code asks for the system library '{lib}', which is "
                                   f"not one tracecomp loads ({', '.join(sorted(SYSTEM_LIBRARY_NAMES))})")
            load_system_library(lib)
        with self._lock:
            lljit = self._current_lljit()
            name = f"tracecomp_{next(self._names)}"
            builder = llvm.JITLibraryBuilder()
            for one in objects:
                builder.add_object_img(one)
            builder.add_current_process()
            for symbol in exports:
                builder.export_symbol(symbol)
            try:
                with timings.stage("jit_link"):
                    tracker = builder.link(lljit, name)
            except RuntimeError as e:
                raise BackendError(f"JIT linking of library '{name}' failed: {_clean(e)}") from None
        if "gomp" in system_libraries:        # OpenBLAS copies loaded by now join tracecomp's team
            blas_team.share_openblas_threads(self)
        return JitLibrary(name, tracker, lljit, exports, aliases)

    def _current_lljit(self) -> llvm.LLJIT:
        if self._lljit is None or self._linked >= self.libraries_per_jit:
            # The old LLJIT stays alive through its libraries' references and goes with them.
            self._lljit = llvm.create_lljit_compiler(self.tm, suppress_errors=True)
            self._linked = 0
        self._linked += 1
        return self._lljit


@functools.lru_cache(maxsize=None)
def default_engine() -> JitEngine:
    return JitEngine()


def compile_module(module: ModuleLike, exports: Optional[Iterable[str]] = None, *,
                   opt: int = target.OPT_LEVEL) -> JitLibrary:
    """Compile `module` with the process-wide engine for the host CPU."""
    return default_engine().compile(module, exports, opt=opt)


def as_module_ref(module: ModuleLike, context: Optional[llvm.ContextRef] = None) -> llvm.ModuleRef:
    """A fresh, verified llvmlite binding module from IR text or an llvmlite.ir.Module, in
    `context` (default: the global one); a ModuleRef is returned as it is."""
    if isinstance(module, llvm.ModuleRef):
        return module
    name = getattr(module, "name", "<tracecomp>")
    try:
        return target.parse(str(module), name, context)
    except RuntimeError as e:
        raise BackendError(f"LLVM rejected module '{name}': {_clean(e)}") from None


def _exported_functions(module_ref: llvm.ModuleRef) -> list[str]:
    return [f.name for f in module_ref.functions
            if not f.is_declaration and f.linkage == llvm.Linkage.external]


def _needed_system_libraries(module_ref: llvm.ModuleRef) -> set[str]:
    needed = set()
    for f in module_ref.functions:
        if f.is_declaration:
            needed.update(lib for prefix, lib in _SYSTEM_LIBRARIES.items() if f.name.startswith(prefix))
    return needed


def _check_external_symbols(module_ref: llvm.ModuleRef, defined_elsewhere: frozenset = frozenset()) -> None:
    """Name a function the module calls that no loaded library defines, before linking:
    ORC's own report ("failed to materialize") does not say which symbol is missing."""
    missing = [f.name for f in module_ref.functions
               if f.is_declaration and not f.name.startswith("llvm.") and f.name not in defined_elsewhere
               and not llvm.address_of_symbol(f.name) and not hasattr(_PROCESS, f.name)]
    if missing:
        raise BackendError(f"module '{module_ref.name}' calls {', '.join(sorted(missing))}, which no "
                           "loaded library defines (load it with load_system_library)")


def _clean(e: Exception) -> str:
    return " ".join(str(e).split())
