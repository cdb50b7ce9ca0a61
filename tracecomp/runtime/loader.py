"""tc.load: call a library written by tc.export from Python.

`load("libmodel.so", name=None)` first checks the file without loading it: an ELF shared
library for this machine whose segments and sections lie inside the file (a truncated
library would otherwise be mapped and die with SIGBUS), defining NAME_metadata, and equal
to its checksum file (`libmodel.so.sha256`, written by tc.export) when that is present.
Then it opens the library, reads NAME_metadata() (JSON), refuses a library compiled for
CPU features this host lacks, and returns an ExportedFunction: called
with the inputs (tc.Tensors, NumPy arrays or anything array-like) it checks each one's
shape and dtype against the metadata, allocates the outputs and calls NAME(inputs, outputs)
through ctypes (one call at a time per library file: its workspace is static).  It
returns the outputs in the exported function's own structure (tuples, lists, dicts with
string keys, as recorded in the metadata), else a tuple of tc.Tensors in flattened order.

Reading the metadata runs only a function that returns a pointer to a constant string,
so it is safe before the CPU check; no kernel runs until the check passed.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from typing import Optional

import numpy as np

from ..errors import ArgumentError, BackendError


_LOCKS: dict[str, threading.Lock] = {}      # per library file: the library is not re-entrant
_LOCKS_LOCK = threading.Lock()


def _lock_for(path: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(os.path.realpath(path), threading.Lock())


_SEEN: dict[str, tuple] = {}      # realpath -> (device, inode, mtime, size) when first opened
_COPIES: list = []                 # temporary folders of private copies, alive for the process


def _fresh_path(path: str) -> str:
    """The path to dlopen.  dlopen hands back the library it already opened under a name,
    so a file exported again to the same path in this process would run the old code:
    such a file is opened through a private copy instead."""
    import shutil
    import tempfile
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    with _LOCKS_LOCK:
        if _SEEN.setdefault(real, key) == key:
            return real
        folder = tempfile.TemporaryDirectory(prefix="tracecomp_load_")
        _COPIES.append(folder)
    copy = os.path.join(folder.name, os.path.basename(real))
    shutil.copyfile(real, copy)
    return copy


def host_cpu_features() -> set[str]:
    """The features this host's CPU has, as LLVM names them ("avx2", "fma", ...)."""
    from ..hostcpu import detected_target
    return _enabled(detected_target().features)


def _enabled(features: str) -> set[str]:
    return {f[1:] for f in features.split(",") if f.startswith("+")}


class ExportedFunction:
    def __init__(self, path: str, lib: ctypes.CDLL, name: str, metadata: dict, sha256: str):
        self.path, self._lib, self.name, self.metadata = path, lib, name, metadata
        self.sha256 = sha256            # of the file as checked and loaded
        self._lock = _lock_for(path)
        self._sizes = list(metadata.get("sizes", []))
        self._entry = getattr(lib, name)
        self._entry.restype = ctypes.c_int
        self._entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * len(self._sizes)
        self._error_string = getattr(lib, f"{name}_error_string")
        self._error_string.restype = ctypes.c_char_p
        self._error_string.argtypes = [ctypes.c_int]
        self._in = [(np.dtype(d["dtype"]), tuple(d["shape"])) for d in metadata["inputs"]]
        self._out = [(np.dtype(d["dtype"]), tuple(d["shape"])) for d in metadata["outputs"]]
        from ..pytree import structure_from_json
        js = metadata.get("output_structure")
        self._structure = structure_from_json(js) if js is not None else None

    def __reduce__(self):
        """Pickled as its path, name and the file's sha256: the copy opens the same file
        (on a file system the receiving process shares) and refuses a file that changed."""
        return _load_same, (self.path, self.name, self.sha256)

    def __repr__(self) -> str:
        sig = ", ".join(f"{dt}{list(s)}" for dt, s in self._in)
        return f"<tc.load'ed {self.name}({sig}) from {self.path}>"

    def error_string(self, code: int) -> str:
        return self._error_string(code).decode()

    def __call__(self, *inputs):
        from .. import pytree
        from ..tensor import Tensor
        if len(inputs) != len(self._in):
            raise ArgumentError(f"{self.name} takes {len(self._in)} inputs, got {len(inputs)}")
        arrays = []
        sizes: dict[str, int] = {}
        for i, (x, (dtype, shape)) in enumerate(zip(inputs, self._in)):
            a = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
            if a.dtype != dtype or not _bind_shape(shape, a.shape, sizes):
                bound = "".join(f"; {n} = {v}" for n, v in sizes.items())
                raise ArgumentError(f"{self.name}: input {i} must be {dtype}{_text(shape)}, "
                                    f"got {a.dtype}{list(a.shape)}{bound}")
            arrays.append(np.ascontiguousarray(a))
        outs = [np.empty(tuple(evaluate_dim(d, sizes) for d in shape), dtype) for dtype, shape in self._out]
        in_ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        with self._lock:       # one static workspace per library: one call at a time
            code = self._entry(in_ptrs, out_ptrs, *(sizes[n] for n in self._sizes))
        if code != 0:
            raise self._failure(code, sizes)
        result = [Tensor.from_numpy(o) for o in outs]
        if self._structure is not None:
            return pytree.unflatten(self._structure, result)
        return result[0] if len(result) == 1 else tuple(result)

    def _failure(self, code: int, sizes: dict) -> Exception:
        """The exception for an error code of the entry point (on the thread that called it):
        a computed index out of range is the ShapeError the traced function raises (its
        index from NAME_error_index, thread-local); other codes an ArgumentError."""
        from ..lower.llvm.entry_point import computed_index_error
        if computed_index_error(self.metadata, code, 0) is not None:
            error_index = getattr(self._lib, f"{self.name}_error_index")
            error_index.restype, error_index.argtypes = ctypes.c_int64, []
            return computed_index_error(self.metadata, code, int(error_index()), sizes)
        return ArgumentError(f"{self.name} failed with error {code}: {self.error_string(code)}")


def _load_same(path: str, name: str, sha256: str) -> ExportedFunction:
    """tc.load of a pickled ExportedFunction: the same library file, or a clear error."""
    loaded = load(path, name)
    if loaded.sha256 != sha256:
        raise BackendError(f"tc.load: {path} changed since the function was pickled (sha256 "
                           f"{loaded.sha256[:12]}..., was {sha256[:12]}...); export it again or "
                           "send the new file")
    return loaded


def _text(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _bind_shape(expected, actual, sizes: dict[str, int]) -> bool:
    """Match an input's shape against the metadata's (ints, size names, size expressions),
    binding each size name at its first occurrence; False on any mismatch."""
    if len(expected) != len(actual):
        return False
    for want, got in zip(expected, actual):
        if isinstance(want, str) and want.isidentifier() and want not in sizes:
            if got < 1:
                return False
            sizes[want] = int(got)
        elif evaluate_dim(want, sizes) != got:
            return False
    return True


def evaluate_dim(dim, sizes: dict[str, int]) -> int:
    """An int, or a size expression of the metadata ("batch", "784*batch", "batch + 1")."""
    if isinstance(dim, int):
        return dim
    total = 0
    for sign, term in _terms(dim):
        value = 1
        for factor in term.split("*"):
            factor = factor.strip()
            value *= int(factor) if factor.lstrip("-").isdigit() else sizes[factor]
        total += sign * value
    return total


def _terms(text: str):
    """(sign, product) pairs of a sum written as symbolic.Dim prints it."""
    sign, out = 1, []
    for part in text.replace(" - ", " + -").split(" + "):
        part = part.strip()
        if part.startswith("-"):
            out.append((-1, part[1:]))
        else:
            out.append((sign, part))
    return out


MAX_LIBRARY_BYTES = 1 << 31


def _check_file(path: str, name: str) -> str:
    """The checks before dlopen (module docstring); BackendError says what is wrong.  The
    sha256 of the bytes checked."""
    from . import elf_check
    from .export import checksum_path
    from .safe_files import UnsafeFile, read_regular
    try:
        data = read_regular(os.path.realpath(path), MAX_LIBRARY_BYTES)
    except (UnsafeFile, OSError) as e:
        raise BackendError(f"tc.load: cannot read {path}: {e}") from None
    try:
        elf_check.check_library(data, f"{name}_metadata", path)
    except elf_check.ElfError as e:
        raise BackendError(f"tc.load: {e}; is it a library written by tc.export (and its name "
                           f"{name!r})?") from None
    digest = hashlib.sha256(data).hexdigest()
    try:
        recorded = read_regular(os.path.realpath(checksum_path(path)), 4096).split()[0].decode()
    except (FileNotFoundError, IndexError, UnicodeDecodeError):
        return digest                 # no checksum file beside it: the structure was checked
    except OSError as e:
        raise BackendError(f"tc.load: cannot read {checksum_path(path)}: {e}") from None
    if digest != recorded:
        raise BackendError(f"tc.load: {path} does not match its checksum file {checksum_path(path)} "
                           "(changed or damaged since tc.export wrote it)")
    return digest


def load(path: str, name: Optional[str] = None) -> ExportedFunction:
    """Open a library written by tc.export (see module docstring)."""
    from .. import __version__
    from .export import default_name
    if not os.path.exists(path):
        raise ArgumentError(f"tc.load: no such file: {path}")
    name = name or default_name(path)
    sha256 = _check_file(path, name)
    try:
        # libgomp through the JIT's loader first: it makes forked children run one thread
        # (libgomp is not fork-safe), which protects the exported library's parallel loops too
        from .jit import load_system_library
        load_system_library("gomp")
    except BackendError:
        pass                           # the library's own NEEDED entry will say what is missing
    try:
        lib = ctypes.CDLL(_fresh_path(path))
    except OSError as e:
        raise BackendError(f"tc.load: cannot open {path}: {e}") from None
    try:
        md_fn = getattr(lib, f"{name}_metadata")
    except AttributeError:
        raise ArgumentError(f"tc.load: {path} has no function {name}_metadata; is it a library "
                            f"written by tc.export, and is its name {name!r}? (pass name=...)") from None
    md_fn.restype = ctypes.c_char_p
    md_fn.argtypes = []
    try:
        metadata = json.loads(md_fn().decode())
    except ValueError as e:
        raise BackendError(f"tc.load: {path} has unreadable metadata: {e}") from None
    if metadata.get("format") != 1:
        raise BackendError(f"tc.load: {path} has metadata format {metadata.get('format')!r}; "
                           f"tracecomp {__version__} reads format 1")
    target = metadata["target"]
    missing = sorted(_enabled(target["features"]) - host_cpu_features())
    if missing:
        raise BackendError(f"tc.load: {path} was compiled for CPU '{target['cpu']}' and uses features "
                           f"this host's CPU lacks: {', '.join(missing)}; export it again on (or for) "
                           "this machine")
    return ExportedFunction(path, lib, name, metadata, sha256)
