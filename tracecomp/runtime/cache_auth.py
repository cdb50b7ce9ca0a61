"""The per-user secret key that authenticates compile-cache entries.

Each entry's JSON carries an HMAC-SHA256, under this key, of the rest of its JSON and of
its object code; an entry whose HMAC does not verify is never linked.  So only holders of
the key can write entries this process will run: a cache folder shared between machines
(a Dask cluster's, say) serves exactly the users who share the key file.

The key file is `$TRACECOMP_CACHE_KEY` if set, else `$XDG_CONFIG_HOME/tracecomp/cache.key`,
else `~/.config/tracecomp/cache.key`: 32 random bytes, created 0600 on first use, and
refused (the disk cache is then off, with a logged warning) if another user owns it or
others can write it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from ..core.safe_files import UnsafeFile, read_regular

KEY_ENV = "TRACECOMP_CACHE_KEY"
KEY_BYTES = 32
DOMAIN = b"tracecomp compile cache entry v1\0"


def key_path() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tracecomp" / "cache.key"


def user_key() -> bytes:
    """This user's key, created on first use; UnsafeFile/OSError if it cannot be trusted."""
    path = key_path()
    try:
        key = read_regular(path, 4096, private=True)
    except FileNotFoundError:
        key = _create(path)
    if len(key) < 16:
        raise UnsafeFile(f"{path} holds {len(key)} bytes; a cache key has at least 16")
    return key


def _create(path: Path) -> bytes:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:                   # another process made it first: use theirs
        return read_regular(path, 4096, private=True)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def canonical(meta: dict) -> bytes:
    """The JSON the HMAC covers: the metadata without its own "hmac" field, canonically."""
    return json.dumps({k: v for k, v in meta.items() if k != "hmac"}, sort_keys=True,
                      separators=(",", ":")).encode()


def sign(key: bytes, meta: dict, obj: bytes) -> str:
    body = canonical(meta)
    mac = hmac.new(key, DOMAIN + len(body).to_bytes(8, "little") + body + obj, hashlib.sha256)
    return mac.hexdigest()


def verify(key: bytes, meta: dict, obj: bytes) -> bool:
    given = meta.get("hmac")
    return isinstance(given, str) and hmac.compare_digest(given, sign(key, meta, obj))
