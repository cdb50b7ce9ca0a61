"""Reading files other users might have placed: no symlinks, only regular files, a size
limit, and the ownership rules ssh and ccache apply to private folders.

A cache entry or key file is only read through `read_regular`, which opens without
following a symlink (O_NOFOLLOW) and without blocking (O_NONBLOCK: a FIFO put in place of
a file would otherwise wait forever), then checks, on the open descriptor, that it is a
regular file of at most `max_bytes`.  `check_private` refuses a folder or file not owned
by this user or writable by group or others.
"""
from __future__ import annotations

import os
import stat


class UnsafeFile(OSError):
    """A path that must not be used as it is (the message says why)."""


def read_regular(path: str | os.PathLike, max_bytes: int, *, private: bool = False) -> bytes:
    """The bytes of the regular file at `path`; FileNotFoundError if there is none,
    UnsafeFile if it is a link, not a regular file, larger than `max_bytes`, or (with
    `private`) not this user's own and closed to others' writes."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        if os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file")
        if st.st_size > max_bytes:
            raise UnsafeFile(f"{path} is {st.st_size} bytes, more than the {max_bytes} allowed")
        if private:
            _check_stat(path, st)
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_private(path: str | os.PathLike) -> None:
    """UnsafeFile unless `path` (not followed if a link) is owned by this user and not
    writable by group or others."""
    _check_stat(path, os.lstat(path))


def _check_stat(path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFile(f"{path} is a symbolic link")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafeFile(f"{path} belongs to user {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o022:
        raise UnsafeFile(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
