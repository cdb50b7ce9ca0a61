"""The on-disk compile cache: a program's kernels as object code, so that a fresh process
calling a function compiled before skips LLVM.

Where and how to switch it:
- the folder is `$TRACECOMP_CACHE_DIR`, else `$XDG_CACHE_HOME/tracecomp`, else
  `~/.cache/tracecomp`; from Python, `tc.compile_cache.directory = path` (None: back to
  the environment's choice);
- `TRACECOMP_CACHE=0` turns it off; from Python, `tc.compile_cache.enabled = False`
  (None: back to the environment's choice);
- `with tc.compile_cache.scoped(enabled=..., directory=...)`: either, in this thread only
  (the torch backend's `cache` option);
- `tc.compile_cache.clear()` deletes the entries; `tc.compile_cache.stats` counts hits,
  misses, stores, rejected (corrupt or unauthenticated) and evicted entries in this process;
- the folder holds at most `$TRACECOMP_CACHE_MAX_BYTES` (default 1 GiB; from Python,
  `tc.compile_cache.max_bytes`): past it, the least recently used entries are deleted.

What is keyed.  The cache sits after the scheduler: the key holds the loop IR of the
program's distinct kernels (walk.kernel_shape_text: every field the code generator reads,
buffers named by position, kernel names left out; kernels that compute the same thing on
other buffers compile once, see compile_kernels), the module name and codegen options,
the opt level, the target triple, CPU name and features, the matmul's tiles, the
tracecomp, llvmlite and LLVM versions, and a hash of tracecomp's own source files and
tables (computed once per process; the package version stays the same while the code
changes).  A hit skips code generation (llvmlite.ir), LLVM's
passes and machine-code emission; tracing, graph passes and scheduling still run, because
the runtime needs the Program (buffers, workspace plan, constants) they build.  LLVM's
passes and machine code are most of a first call (W5's stages: BENCHMARKS.md, "Figures
that were in the code").  Keying on the LLVM IR text would keep codegen and the text in
every warm call; keying on the optimized graph would also skip the scheduling, but the
scheduler sizes matmul workspaces by the host's core count, which the graph does not
show and the loop IR does.

An entry is two files in `<dir>/v1/<key[:2]>/`: `<key>.o`, the ELF object, and
`<key>.json`, its metadata (key, object size and sha256, exported symbols, system
libraries, the key's parts for humans, and an HMAC).  No Python object is ever
deserialized: loading parses JSON, checks the object's size and sha256 and links it; a
system library is loaded only if its name is one tracecomp itself loads
(jit.SYSTEM_LIBRARY_NAMES).

Trust.  Whoever can write an entry can make this process run their machine code, so:
folders are created private (0700), and a folder not owned by this user or writable by
group or others is not used at all (logged; the code is compiled in memory), as ssh and
ccache refuse such folders; files are read without following links, only if regular and
of bounded size (safe_files.py); each entry carries an HMAC-SHA256 under this user's
secret key (cache_auth.py) over its JSON and object, checked before anything else, so
only holders of the key can write entries that are used; and the object's ELF structure
is checked (elf_check.py) before the JIT links it.
Invariants:
- writes are atomic: each file goes to a temporary name in its folder, then os.replace;
  the object is written before the JSON that vouches for it, so a reader sees no entry,
  a whole one, or (two writers racing) a JSON whose sha256 does not match the object;
- an entry that does not parse, does not match its key, or whose object fails the size or
  sha256 check or does not link is logged (logger "tracecomp.cache"), recompiled and
  overwritten; processes compiling the same key at once each compile and write whole files;
- a cache that cannot be read or written (permissions, full disk) never fails a compile:
  it is logged and the code is compiled as if there were no cache;
- eviction is safe while other processes read and write: a hit touches its files (the
  LRU order is their mtime), and an entry deleted while read is a miss;
- the cap holds across processes: the folder's size count is shared (`<dir>/v<FORMAT>/usage`,
  updated under its flock, see DiskCache._account), so after concurrent writers finish
  the folder holds at most the cap (or just the last entry, if that alone is larger).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import llvmlite
import llvmlite.binding as llvm

from ..lower import hostcpu
from ..core.errors import BackendError
from ..core.version import __version__
from ..lower.loops.ir import Kernel
from ..lower.loops.walk import kernel_shape_text
from ..lower.schedule.tiles import half_paths, host_tiles
from . import cache_auth, compile_worker, elf_check, jit
from ..lower.llvm import target
from ..core.safe_files import UnsafeFile, check_private, read_regular

log = logging.getLogger("tracecomp.cache")

FORMAT = 4                   # bump when the entry layout or the key's meaning changes
MAX_BYTES_ENV = "TRACECOMP_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30  # the folder's size cap
MAX_JSON_BYTES = 1 << 20     # larger files are not entries anyone here wrote
MAX_OBJECT_BYTES = 1 << 30
_PACKAGE = Path(__file__).resolve().parent.parent


def default_directory() -> Path:
    """The user's cache folder when no setting names one: `$XDG_CACHE_HOME/tracecomp`, else
    `~/.cache/tracecomp` (the host's tuning record lives there too, runtime/tuning.py)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracecomp"


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    rejected: int = 0        # entries found corrupt, truncated, unauthenticated or unlinkable
    evicted: int = 0         # entries deleted to keep the folder under its cap

    def copy(self) -> "CacheStats":
        return dataclasses.replace(self)

    def only_hits_since(self, before: "CacheStats") -> bool:
        """Whether every lookup since `before` (an earlier copy()) found its code, so what
        compiled meanwhile came from the cache (a hit of shared glue, the plan runner, beside
        a missed program's kernels does not count)."""
        return self.hits > before.hits and self.misses == before.misses


# (enabled, directory) set by CacheSettings.scoped for the current thread, or None
_scoped: contextvars.ContextVar = contextvars.ContextVar("tracecomp_cache_scoped", default=None)


class CacheSettings:
    """The process-wide switch and folder (`tc.compile_cache`); None defers to the
    environment, read at each compile."""

    def __init__(self) -> None:
        self._enabled: Optional[bool] = None
        self._directory: Optional[Path] = None
        self._max_bytes: Optional[int] = None
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        scoped = _scoped.get()
        if scoped is not None and scoped[0] is not None:
            return scoped[0]
        if self._enabled is not None:
            return self._enabled
        return switched_on("TRACECOMP_CACHE")

    @enabled.setter
    def enabled(self, value: Optional[bool]) -> None:
        self._enabled = None if value is None else bool(value)

    @property
    def directory(self) -> Path:
        scoped = _scoped.get()
        if scoped is not None and scoped[1] is not None:
            return scoped[1]
        if self._directory is not None:
            return self._directory
        if os.environ.get("TRACECOMP_CACHE_DIR"):
            return Path(os.environ["TRACECOMP_CACHE_DIR"])
        return default_directory()

    @directory.setter
    def directory(self, value: Optional[str | os.PathLike]) -> None:
        self._directory = None if value is None else Path(value)

    @property
    def max_bytes(self) -> int:
        if self._max_bytes is not None:
            return self._max_bytes
        setting = os.environ.get(MAX_BYTES_ENV, "").strip()
        try:
            return int(setting) if setting else DEFAULT_MAX_BYTES
        except ValueError:
            log.warning("compile cache: %s=%r is not a number of bytes; using %d", MAX_BYTES_ENV,
                        setting, DEFAULT_MAX_BYTES)
            return DEFAULT_MAX_BYTES

    @max_bytes.setter
    def max_bytes(self, value: Optional[int]) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"compile_cache.max_bytes must be a non-negative int or None, got {value!r}")
        self._max_bytes = value

    def off(self) -> contextlib.AbstractContextManager:
        """Inside, in this thread: no lookups, no stores (the switch as it was afterwards)."""
        return self.scoped(enabled=False)

    @contextlib.contextmanager
    def scoped(self, enabled: Optional[bool] = None, directory: Optional[str | os.PathLike] = None) -> Iterator[None]:
        """Inside, in this thread (a context variable) only: the switch and/or the folder
        given (None: as outside), over the process-wide settings and the environment.  The
        torch backend's `cache` option compiles each graph inside one."""
        outer = _scoped.get() or (None, None)
        token = _scoped.set((outer[0] if enabled is None else bool(enabled),
                             outer[1] if directory is None else Path(directory)))
        try:
            yield
        finally:
            _scoped.reset(token)

    def clear(self) -> None:
        """Delete every entry of the current folder."""
        shutil.rmtree(self.directory / f"v{FORMAT}", ignore_errors=True)

    def __repr__(self) -> str:
        return f"<tracecomp compile cache {'on' if self.enabled else 'off'} at {self.directory}>"


def switched_on(variable: str) -> bool:
    """An on/off environment switch, on unless set to 0, false, no or off."""
    return os.environ.get(variable, "1").strip().lower() not in ("0", "false", "no", "off")


settings = CacheSettings()
# Called with each folder a compile uses the cache in.  tuning.py registers the one that
# leaves its record there: it reads this module's settings, so this module cannot import it.
folder_used: list[Callable[[Path], None]] = []


# ----------------------------------------------------------------------------- the key

@dataclass(frozen=True)
class KeyParts:
    """Everything that decides the object code of a module of kernels."""
    kernels: str             # repr of the loop IR
    module: str
    options: str             # codegen and target-machine options
    opt: int
    triple: str
    cpu: str
    features: str
    tiles: str               # the matmul's blocking (schedule/tiles.py: also from the caches)
    tracecomp_version: str
    llvmlite_version: str
    llvm_version: str
    source_hash: str

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def key_parts(kernels: Sequence[Kernel], module_name: str, *, align: Optional[int],
              opt: int = target.OPT_LEVEL, host: Optional[hostcpu.HostTarget] = None,
              fastmath: Sequence[str] = (), texts: Optional[Sequence[str]] = None) -> KeyParts:
    host = host or target.host_target()
    # Kernels are keyed by what they compute, in order, not by name (kernel_shape_text): a
    # name tells the source line it came from, and a function sent by value to a Dask
    # worker arrives without its file name.  `texts`: those, computed already.
    texts = [kernel_shape_text(k) for k in kernels] if texts is None else texts
    return KeyParts(kernels="\n\n".join(texts), module=module_name,
                    options=f"align={align} reloc=default codemodel=jitdefault fastmath={','.join(fastmath)}",
                    opt=opt, triple=host.triple, cpu=host.cpu, features=host.features,
                    tiles=repr(sorted((str(d), t) for d, t in host_tiles().items())) + repr(half_paths()),
                    tracecomp_version=__version__, llvmlite_version=llvmlite.__version__,
                    llvm_version=".".join(map(str, llvm.llvm_version_info)),
                    source_hash=source_hash())


def source_files() -> list[Path]:
    """tracecomp's Python sources and its two tables: what the code it generates depends on."""
    from ..ops.table import table_path
    return sorted(_PACKAGE.rglob("*.py")) + [table_path("ops.yaml"), table_path("derivatives.yaml")]


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over `source_files()` (names and contents), once per process."""
    h = hashlib.sha256()
    for path in source_files():
        name = path.relative_to(_PACKAGE) if path.is_relative_to(_PACKAGE) else Path(path.name)
        data = path.read_bytes()
        h.update(f"{name.as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


# ----------------------------------------------------------------------------- entries

class CorruptEntry(Exception):
    """An entry on disk that must not be used (the message says why)."""


class DiskCache:
    """The entries under one folder: `load` and `store` by key (a sha256 hex digest),
    authenticated with `secret` (cache_auth.py)."""

    def __init__(self, directory: Path, secret: bytes):
        self.directory = Path(directory)
        self.root = self.directory / f"v{FORMAT}"
        self.secret = secret

    @classmethod
    def open(cls, directory: Path) -> Optional["DiskCache"]:
        """The cache in `directory`, made private if new; None (logged once) if the folder or
        the user's key cannot be trusted: the code is then compiled in memory only."""
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_private(directory)
            root = directory / f"v{FORMAT}"
            if root.exists():
                check_private(root)
            return cls(directory, cache_auth.user_key())
        except OSError as e:
            if str(directory) not in _WARNED:
                _WARNED.add(str(directory))
                log.warning("compile cache: not using %s: %s", directory, e)
            return None

    def paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}.o", folder / f"{key}.json"

    def load(self, key: str) -> Optional[jit.ObjectCode]:
        """The entry's object code, None if there is none; CorruptEntry if it is damaged or
        not authenticated by this user's key."""
        obj_path, meta_path = self.paths(key)
        try:
            if obj_path.parent.exists():
                check_private(obj_path.parent)
            meta_bytes = read_regular(meta_path, MAX_JSON_BYTES, private=True)
            obj = read_regular(obj_path, MAX_OBJECT_BYTES, private=True)
        except FileNotFoundError:
            return None                  # none, or evicted by another process meanwhile
        except UnsafeFile as e:
            raise CorruptEntry(str(e)) from None
        try:
            meta = json.loads(meta_bytes)        # ValueError on bad UTF-8 or JSON
        except (ValueError, RecursionError) as e:
            raise CorruptEntry(f"{type(e).__name__}: {e}") from None
        if not isinstance(meta, dict) or not cache_auth.verify(self.secret, meta, obj):
            raise CorruptEntry("its HMAC does not verify: not written with this user's cache key")
        code = _checked(meta, obj, key)
        try:
            os.utime(meta_path)          # recently used: eviction goes by this mtime
        except OSError:
            pass
        return code

    def store(self, key: str, code: jit.ObjectCode, parts: KeyParts, max_bytes: int) -> int:
        """Write the entry, then evict least recently used ones past `max_bytes`; returns
        how many were evicted."""
        obj_path, meta_path = self.paths(key)
        meta = {"format": FORMAT, "key": key, "object_size": len(code.object),
                "object_sha256": hashlib.sha256(code.object).hexdigest(),
                "exports": list(code.exports), "system_libraries": list(code.system_libraries),
                "object_sizes": list(code.object_sizes),
                "parts": {k: v for k, v in asdict(parts).items() if k != "kernels"}}
        meta["hmac"] = cache_auth.sign(self.secret, meta, code.object)
        for folder in (self.root, obj_path.parent):
            folder.mkdir(mode=0o700, exist_ok=True)
            check_private(folder)
        meta_bytes = json.dumps(meta, indent=1).encode()
        _write_atomically(obj_path, code.object)
        _write_atomically(meta_path, meta_bytes)
        return self._account(len(code.object) + len(meta_bytes), max_bytes, keep=key)

    def _account(self, added: int, max_bytes: int, keep: str) -> int:
        """Add `added` bytes (an entry just written) to the folder's shared size count and
        evict past `max_bytes`; returns how many entries were evicted.

        The count lives in USAGE_FILE, read and written under an flock on that file, so
        every process sharing the folder sees the others' stores (a per-process count let
        four processes fill a folder to nearly twice its cap).  It never undercounts what
        its writers have accounted: an entry written twice or deleted by clear() only
        overcounts, which costs an early scan; a missing or unreadable count, and every
        RESCAN_STORES stores of this process, measure the folder again (entries left by
        another tracecomp version, or by hand).  So once writers are done, the folder holds
        at most `max_bytes`, or only the entry last written if that alone is larger."""
        seen = _STORES_SINCE_SCAN.get(str(self.root), 0) + 1
        with _locked_usage(self.root) as usage:
            count = _read_count(usage)
            if count is None or seen >= RESCAN_STORES or count + added > max_bytes:
                evicted, total = self.evict(max_bytes, keep=keep)
                seen = 0
            else:
                evicted, total = 0, count + added
            _write_count(usage, total)
        _STORES_SINCE_SCAN[str(self.root)] = seen
        return evicted

    def evict(self, max_bytes: int, keep: str = "") -> tuple[int, int]:
        """Delete least recently used entries (by their JSON's mtime) until the folder holds
        at most `max_bytes`; never `keep`.  Files another process deletes meanwhile are
        skipped, and a reader that loses an entry sees a miss.  Returns (entries deleted,
        bytes left)."""
        entries, total = [], 0
        for meta_path in self.root.glob("*/*.json"):
            try:
                size = meta_path.stat().st_size + meta_path.with_suffix(".o").stat().st_size
                entries.append((meta_path.stat().st_mtime, meta_path, size))
            except FileNotFoundError:
                continue
            total += size
        evicted = 0
        for _, meta_path, size in sorted(entries):
            if total <= max_bytes:
                break
            if meta_path.stem == keep:
                continue
            for path in (meta_path, meta_path.with_suffix(".o")):     # the JSON first: no half entry is used
                path.unlink(missing_ok=True)
            total -= size
            evicted += 1
        return evicted, total


_WARNED: set[str] = set()
RESCAN_STORES = 64
USAGE_FILE = "usage"                    # in the versioned folder: its byte count, and its lock
_STORES_SINCE_SCAN: dict[str, int] = {}     # folder -> this process's stores since it measured it


@contextlib.contextmanager
def _locked_usage(root: Path) -> Iterator[int]:
    """The folder's usage file (created private, never through a link), open and held
    under an exclusive flock: one process at a time counts or evicts."""
    fd = os.open(root / USAGE_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{root / USAGE_FILE} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)          # released when fd closes
        yield fd
    finally:
        os.close(fd)


def _read_count(fd: int) -> Optional[int]:
    """The byte count in the usage file; None if it is empty or not a count."""
    text = os.pread(fd, 32, 0)
    return int(text) if text.strip().isdigit() else None


def _write_count(fd: int, count: int) -> None:
    data = str(max(0, count)).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _checked(meta, obj: bytes, key: str) -> jit.ObjectCode:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("key") != key:
        raise CorruptEntry("metadata of another format or key")
    if meta.get("object_size") != len(obj):
        raise CorruptEntry(f"object is {len(obj)} bytes, metadata says {meta.get('object_size')}")
    if meta.get("object_sha256") != hashlib.sha256(obj).hexdigest():
        raise CorruptEntry("object's sha256 does not match the metadata")
    exports, libraries = meta.get("exports"), meta.get("system_libraries")
    if not (isinstance(exports, list) and all(isinstance(s, str) for s in exports)
            and isinstance(libraries, list) and set(libraries) <= jit.SYSTEM_LIBRARY_NAMES):
        raise CorruptEntry("malformed exports or system libraries in the metadata")
    sizes = meta.get("object_sizes", [])
    if not (isinstance(sizes, list) and all(type(n) is int and n > 0 for n in sizes)
            and (not sizes or sum(sizes) == len(obj))):
        raise CorruptEntry(f"object sizes {sizes} in the metadata do not add up to the object")
    at = 0
    for i, n in enumerate(sizes or [len(obj)]):      # LLVM's linker must get sound ELF only
        try:
            elf_check.check_object(obj[at:at + n], f"object {i}")
        except elf_check.ElfError as e:
            raise CorruptEntry(str(e)) from None
        at += n
    return jit.ObjectCode(obj, tuple(exports), tuple(libraries), tuple(sizes))


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ----------------------------------------------------------------------------- compiling

def compile_kernels(kernels: Sequence[Kernel], module_name: str, *,
                    align: Optional[int] = None, fastmath: Sequence[str] = ()) -> jit.JitLibrary:
    """The kernels as one JIT library: from the cache when an entry matches, else generated,
    compiled and stored.  Kernels that compute the same thing on other buffers (the
    kernel_shape_text is the same: a transformer's layers, each parameter's update) are
    compiled once; the others' names are aliases of the first's function."""
    distinct: dict[str, Kernel] = {}
    same_as: dict[str, str] = {}
    for k in kernels:
        first = distinct.setdefault(kernel_shape_text(k), k)
        if first is not k:
            same_as[k.name] = first.name
    library = _compile_distinct(list(distinct.values()), list(distinct), module_name, align, fastmath)
    library.aliases.update({name: library.aliases.get(first, first) for name, first in same_as.items()})
    return library


def _compile_distinct(kernels: list[Kernel], texts: list[str], module_name: str, align: Optional[int],
                      fastmath: Sequence[str]) -> jit.JitLibrary:
    """`kernels` (each one's kernel_shape_text in `texts`: the key's loop IR) as a library."""
    engine = jit.default_engine()

    def compiled() -> jit.ObjectCode:
        return compile_worker.compile_kernels_object(engine, kernels, module_name, align=align,
                                                     fastmath=fastmath, texts=texts)
    if not settings.enabled:
        return engine.add_code(compiled())
    parts = key_parts(kernels, module_name, align=align, fastmath=fastmath, texts=texts)
    if " at 0x" in parts.kernels:
        # an object without a repr of its own in the loop IR: its address would make every
        # process's key new, so the cache would only grow; compile without it
        log.warning("compile cache: the loop IR of %s prints an object address; not cached", module_name)
        return engine.add_code(compiled())
    key = parts.digest()
    disk = DiskCache.open(settings.directory)
    if disk is None:
        return engine.add_code(compiled())
    for hook in folder_used:
        hook(disk.directory)
    names = [k.name for k in kernels]
    library = _load(disk, key, engine, names)
    if library is not None:
        return library
    settings.stats.misses += 1
    code = compiled()
    try:
        # exports in kernel order: a process whose kernels are named otherwise maps them by position
        stored = dataclasses.replace(code, exports=tuple(names)) if sorted(code.exports) == sorted(names) else code
        settings.stats.evicted += disk.store(key, stored, parts, settings.max_bytes)
        settings.stats.stores += 1
    except OSError as e:
        log.warning("compile cache: cannot store %s in %s: %s", module_name, disk.root, e)
    return engine.add_code(code)


def _load(disk: DiskCache, key: str, engine: jit.JitEngine,
          kernel_names: list[str]) -> Optional[jit.JitLibrary]:
    try:
        code = disk.load(key)
        if code is None:
            return None
        if len(code.exports) != len(kernel_names) or len(set(code.exports)) != len(code.exports):
            raise CorruptEntry(f"exports {sorted(code.exports)}, expected the kernels {sorted(kernel_names)}")
        library = engine.add_code(code, aliases={name: symbol for name, symbol in zip(kernel_names, code.exports)
                                                 if name != symbol})
    except OSError as e:
        log.warning("compile cache: cannot read entry %s under %s: %s", key, disk.root, e)
        return None
    except (CorruptEntry, BackendError) as e:
        settings.stats.rejected += 1
        log.warning("compile cache: entry %s under %s is unusable (%s); recompiling", key, disk.root, e)
        return None
    settings.stats.hits += 1
    log.debug("compile cache: hit %s", key)
    return library
