"""tc.load: call a library written by tc.export from Python.

`load("libmodel.so", name=None)` reads the file once (safe_files: a regular file, never a
FIFO or device; a symlink to a library is followed) and checks those bytes without
loading them: an ELF shared library for this machine whose segments and sections lie
inside the file (a truncated library would otherwise be mapped and die with SIGBUS),
defining NAME, NAME_metadata and NAME_error_string as functions in executable code, and
equal to its checksum file (`libmodel.so.sha256` beside the real file, written by
tc.export) when that is present; a checksum file that is present must hold a digest.
Then it maps a private copy of exactly those bytes (private_copies.py: one mapping, one
lock, per distinct library content, released when the last function using it goes),
reads and checks NAME_metadata() (library_metadata.py), refuses a library compiled for
CPU features this host lacks, and returns an ExportedFunction: called with the inputs
(tc.Tensors, NumPy arrays or anything array-like) it checks each one's shape and dtype
against the metadata, allocates the outputs and calls NAME(inputs, outputs) through ctypes
(one call at a time per mapping: its workspace is static).  It returns the outputs in the
exported function's own structure (tuples, lists, dicts with string keys, as recorded in
the metadata), else a tuple of tc.Tensors in flattened order.

Trust: the checks make damage and foreign files errors; they do not make a hostile
library safe.  Loading a library runs its code (its constructors at dlopen, its metadata
function), and a checksum file beside it proves only that the two agree: whoever can
write the folder can replace both.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import time
from typing import Optional

import numpy as np

from ..core.errors import ArgumentError, BackendError
from ..runtime.library_metadata import floor_parts, read_metadata, size_terms, term_factors
from ..runtime.private_copies import Mapping, mapped


def host_cpu_features() -> set[str]:
    """The features this host's CPU has, as LLVM names them ("avx2", "fma", ...)."""
    from ..lower.hostcpu import detected_target
    return _enabled(detected_target().features)


def _enabled(features: str) -> set[str]:
    return {f[1:] for f in features.split(",") if f.startswith("+")}


class ExportedFunction:
    def __init__(self, path: str, mapping: Mapping, name: str, metadata: dict, sha256: str):
        self.path, self.name, self.metadata = path, name, metadata
        self._mapping = mapping         # keeps the library mapped while this function lives
        self._lib = lib = mapping.library
        self.sha256 = sha256            # of the bytes checked and loaded
        self._lock = mapping.lock       # shared by every function of the same library bytes
        self._sizes = list(metadata.get("sizes", []))
        self._entry = getattr(lib, name)
        self._entry.restype = ctypes.c_int
        self._entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * len(self._sizes)
        self._error_string = getattr(lib, f"{name}_error_string")
        self._error_string.restype = ctypes.c_char_p
        self._error_string.argtypes = [ctypes.c_int]
        self._in = [(np.dtype(d["dtype"]), tuple(d["shape"])) for d in metadata["inputs"]]
        self._out = [(np.dtype(d["dtype"]), tuple(d["shape"])) for d in metadata["outputs"]]
        from ..tensors.pytree import structure_from_json
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
        from ..tensors import pytree
        from ..tensors.tensor import Tensor
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
        index from NAME_error_index, thread-local); the tile state refused, a BackendError;
        other codes an ArgumentError."""
        from ..lower.llvm.entry_point import ERR_NO_TILES, computed_index_error
        if code == ERR_NO_TILES:
            return BackendError(f"{self.name}: {self.error_string(code)}")
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
    """An int, or a size expression of the metadata ("batch", "784*batch", "batch + 1", "floor((h + 1)/2)")."""
    if isinstance(dim, int):
        return dim
    total = 0
    for sign, term in size_terms(dim):
        value = 1
        for factor in term_factors(term):
            floor = floor_parts(factor)
            value *= evaluate_dim(floor[0], sizes) // floor[1] if floor is not None else \
                int(factor) if factor.lstrip("-").isdigit() else sizes[factor]
        total += sign * value
    return total


MAX_LIBRARY_BYTES = 1 << 31
MAX_CHECKSUM_BYTES = 4096
CHECKSUM_TRIES = 3             # a mismatch is read again: export may be between two renames


def _read_checked(path: str, name: str) -> tuple[bytes, str]:
    """The library's bytes and their sha256, after the checks before dlopen (module
    docstring); BackendError says what is wrong.  export.install renames the checksum
    before the library, so a mismatch can be a reader that got the old library and the new
    checksum: it is read again, briefly, before it counts as damage."""
    for attempt in range(CHECKSUM_TRIES):
        data = _read_library(path, name)
        digest = hashlib.sha256(data).hexdigest()
        recorded = _recorded_checksum(path)
        if recorded is None or recorded == digest:
            return data, digest
        time.sleep(0.05 * (attempt + 1))
    raise BackendError(f"tc.load: {path} does not match its checksum file {_checksum_file(path)} "
                       "(changed or damaged since tc.export wrote it)")


def _read_library(path: str, name: str) -> bytes:
    from ..core.safe_files import read_regular
    try:
        data = read_regular(path, MAX_LIBRARY_BYTES, follow_links=True)
    except OSError as e:             # UnsafeFile among them: a FIFO, a device, too large
        raise BackendError(f"tc.load: cannot read {path}: {e.strerror or e}") from None
    _check_functions(data, name, [f"{name}_metadata", name, f"{name}_error_string"], path)
    return data


def _check_functions(data: bytes, name: str, functions: list[str], path: str) -> None:
    """elf_check.check_library for the library `name`, its ElfError as a BackendError."""
    from ..runtime import elf_check
    try:
        elf_check.check_library(data, functions, path)
    except elf_check.ElfError as e:
        raise BackendError(f"tc.load: {e}; is it a library written by tc.export (and its name "
                           f"{name!r})?") from None


def _checksum_file(path: str) -> str:
    """The checksum beside the real file (a symlink's target keeps its checksum)."""
    from .shared_library import checksum_path
    return checksum_path(os.path.realpath(path))


def _recorded_checksum(path: str) -> Optional[str]:
    """The digest in the library's checksum file, None if there is no such file.  A file
    that is present must be a regular one holding a sha256 digest (sha256sum's format)."""
    from ..core.safe_files import read_regular
    where = _checksum_file(path)
    try:
        text = read_regular(where, MAX_CHECKSUM_BYTES)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BackendError(f"tc.load: cannot read the checksum file {where}: {e.strerror or e}") from None
    fields = text.split()
    if not fields:
        raise BackendError(f"tc.load: the checksum file {where} is empty; it should hold the "
                           f"library's sha256 (export it again, or delete the file)")
    digest = fields[0].decode("latin-1").lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise BackendError(f"tc.load: the checksum file {where} does not start with a sha256 digest "
                           f"(64 hex digits), it starts with {text[:40]!r}; export it again, or "
                           "delete the file")
    return digest


def load(path: str, name: Optional[str] = None) -> ExportedFunction:
    """Open a library written by tc.export (see module docstring)."""
    from .shared_library import default_name
    if not os.path.exists(path):
        raise ArgumentError(f"tc.load: no such file: {path}")
    name = name or default_name(path)
    data, sha256 = _read_checked(path, name)
    try:
        # libgomp through the JIT's loader first: it makes forked children run one thread
        # (libgomp is not fork-safe), which protects the exported library's parallel loops too
        from ..runtime.jit import load_system_library
        load_system_library("gomp")
    except BackendError:
        pass                           # the library's own NEEDED entry will say what is missing
    real = os.path.realpath(path)
    try:
        mapping = mapped(data, sha256, os.path.basename(real), os.path.dirname(real))
    except OSError as e:
        raise BackendError(f"tc.load: cannot open {path}: {e}") from None
    metadata = read_metadata(mapping.library, name, path)
    if metadata.get("computed_index_checks"):      # their failures call NAME_error_index
        _check_functions(data, name, [f"{name}_error_index"], path)
    target = metadata["target"]
    missing = sorted(_enabled(target["features"]) - host_cpu_features())
    if missing:
        raise BackendError(f"tc.load: {path} was compiled for CPU '{target['cpu']}' and uses features "
                           f"this host's CPU lacks: {', '.join(missing)}; export it again on (or for) "
                           "this machine")
    return ExportedFunction(path, mapping, name, metadata, sha256)
