"""Private copies of loaded libraries: tc.load maps the very bytes it checked, as its own.

Why a copy rather than dlopen of the user's path:
- dlopen hands back the library it already opened under the same name, so a file exported
  again to the same path would silently run the old code;
- the bytes checked (ELF structure, checksum, symbol types) are the bytes mapped: nobody
  can swap the file between the check and dlopen;
- the mapping is the library's own: the file may later be replaced or deleted and a
  loaded function keeps working.

Invariants:
- one mapping per distinct content (sha256) alive in the process, so a file loaded under
  several names (a hard link, a symlink, a byte-identical copy) shares one mapping, hence
  one static workspace and one lock (`Mapping.lock`);
- a copy's file and folder exist only between writing it and dlopen: the mapping keeps
  the inode alive, nothing stays on disk;
- folders are named `tracecomp-load-<pid>-<n>-<random>` (n counts up in the process), so
  the dynamic loader never sees one name twice in a process, and a folder whose process
  died between writing and dlopen is removed by this user's next process that loads;
- a mapping is dlclosed when the last ExportedFunction holding it is collected: no call
  can be running then (a call holds its function), and the library's code leaves nothing
  behind that points into it (outputs are NumPy's, strings are copied).  Not at
  interpreter exit: the process is ending anyway.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref

PREFIX = "tracecomp-load-"
ABANDONED_AFTER_S = 60        # a live process needs milliseconds between writing and dlopen

_counter = itertools.count()
_mapped: "weakref.WeakValueDictionary[str, Mapping]" = weakref.WeakValueDictionary()
_mapped_lock = threading.Lock()
_swept: set[str] = set()      # folders already searched for abandoned copies


class Mapping:
    """One dlopen'ed private copy: `library` (a ctypes.CDLL) and `lock`, held around every
    call because the library's workspace is static (one call at a time)."""

    def __init__(self, library: ctypes.CDLL):
        self.library = library
        self.lock = threading.Lock()
        release = weakref.finalize(self, _dlclose, library._handle)
        release.atexit = False


def mapped(data: bytes, digest: str, file_name: str, fallback_folder: str) -> Mapping:
    """The live mapping of the library whose bytes are `data` (sha256 `digest`), opening a
    private copy named `file_name` if there is none.  The copy goes in the temporary
    folder, or in `fallback_folder` (the library's own) where the temporary folder does not
    allow code to be mapped (mounted noexec).  OSError says why it cannot be opened."""
    with _mapped_lock:
        mapping = _mapped.get(digest)
        if mapping is None:
            mapping = Mapping(_open_copy(data, file_name, fallback_folder))
            _mapped[digest] = mapping
        return mapping


def _open_copy(data: bytes, file_name: str, fallback_folder: str) -> ctypes.CDLL:
    try:
        return _dlopen_copy(data, file_name, tempfile.gettempdir())
    except OSError as e:
        if "failed to map segment" not in str(e):
            raise
        try:
            return _dlopen_copy(data, file_name, fallback_folder)
        except OSError as again:
            raise OSError(f"{e}; and beside the library: {again}") from None


def _dlopen_copy(data: bytes, file_name: str, parent: str) -> ctypes.CDLL:
    """dlopen a copy of `data` written under `parent`; the copy and its folder are gone
    when this returns (or raises)."""
    _remove_abandoned(parent)
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{next(_counter)}-", dir=parent)
    copy = os.path.join(folder, file_name)
    try:
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o700)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return ctypes.CDLL(copy)
    finally:                  # the mapping holds the inode: nothing stays on disk
        with contextlib.suppress(OSError):
            os.unlink(copy)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _remove_abandoned(parent: str) -> None:
    """Remove this user's copy folders under `parent` whose process is gone (once per
    folder and process: a process dies with a folder only if killed within milliseconds)."""
    if parent in _swept:
        return
    _swept.add(parent)
    now = time.time()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        pid = entry.name[len(PREFIX):].split("-", 1)[0]
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (pid.isdigit() and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                and st.st_mtime < now - ABANDONED_AFTER_S and not _alive(int(pid))):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:            # someone else's process: alive
        return True
    return True


def _dlclose(handle: int) -> None:
    """Unmap a library (from a finalizer: takes no Python lock, so it cannot deadlock with
    the thread the garbage collector interrupted)."""
    import _ctypes
    _ctypes.dlclose(handle)
