"""Files other users, other processes or a careless hand might have placed or might be
reading: the one place where tracecomp opens a user's file for reading, and where it
replaces a file it writes.

Reading.  `opened_regular` (and `read_regular` on top of it) opens without blocking
(O_NONBLOCK: a FIFO put in place of a file would otherwise wait forever for a writer),
by default without following a final symlink (O_NOFOLLOW), then checks on the open
descriptor, not on the name, that it is a regular file (no FIFO, device, socket or
folder) of at most `max_bytes`, and optionally private: owned by this user and closed to
others' writes (the rules ssh and ccache apply).  Every reader of user files goes through
it: tc.load (library, checksum), checkpoints, the compile cache, its key and the
tuning record beside it, and Dask's .npy inputs; `descriptor_path` hands the checked
file to a library that opens files by name.

Writing.  `write_beside` writes new bytes to a fresh file in the target's own folder;
the caller renames it over the target with os.replace.  A file is never rewritten in
place: a process that has the old file mapped (a loaded library) or open keeps the old
bytes, and a reader sees the old file or the new one, never a mix.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import Iterator, Optional


class UnsafeFile(OSError):
    """A path that must not be used as it is (the message says why)."""


@contextlib.contextmanager
def opened_regular(path: str | os.PathLike, max_bytes: Optional[int] = None, *,
                   follow_links: bool = False, private: bool = False
                   ) -> Iterator[tuple[int, os.stat_result]]:
    """(descriptor, its stat) of the regular file at `path`, closed on exit.

    FileNotFoundError if there is none; UnsafeFile if it is a symbolic link (unless
    `follow_links`), not a regular file, larger than `max_bytes`, or (with `private`) not
    this user's own and closed to others' writes.  Never blocks on a FIFO or a device."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not isinstance(e, FileNotFoundError) and not follow_links and os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file ({_kind(st.st_mode)})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFile(f"{path} is {st.st_size} bytes, more than the {max_bytes} allowed")
        if private:
            _check_stat(path, st)
        yield fd, st
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike, max_bytes: int, *, private: bool = False,
                 follow_links: bool = False) -> bytes:
    """The bytes of the regular file at `path` (the checks of `opened_regular`)."""
    with opened_regular(path, max_bytes, follow_links=follow_links, private=private) as (fd, st):
        return read_all(fd, st.st_size)


def read_all(fd: int, size: int, offset: int = 0) -> bytes:
    """Up to `size` bytes from `offset` of an open file (fewer if it ends sooner)."""
    chunks, left = [], size
    while left > 0:
        chunk = os.pread(fd, min(left, 1 << 24), offset)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def descriptor_path(fd: int, path: str | os.PathLike) -> str:
    """A name that opens the very file behind the open descriptor `fd` (Linux's
    /proc/self/fd), for libraries that take only names (safetensors, np.load with mmap):
    the file checked is the file they read.  Elsewhere `path` itself."""
    name = f"/proc/self/fd/{fd}"
    return name if os.path.exists(name) else os.fspath(path)


def check_private(path: str | os.PathLike) -> None:
    """UnsafeFile unless `path` (not followed if a link) is owned by this user and not
    writable by group or others."""
    _check_stat(path, os.lstat(path))


def write_beside(path: str | os.PathLike, data: bytes, mode: int = 0o666) -> str:
    """A new file in `path`'s folder holding `data` (flushed to disk), created with `mode`
    less the umask; its name is returned for the caller to os.replace over `path` (or to
    remove).  The name is hidden and unique, so concurrent writers never share it."""
    folder, base = os.path.split(os.path.abspath(os.fspath(path)))
    temp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    return temp


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return word
    return f"mode {mode:o}"


def _check_stat(path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFile(f"{path} is a symbolic link")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafeFile(f"{path} belongs to user {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o022:
        raise UnsafeFile(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
