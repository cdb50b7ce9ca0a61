"""Issue 19's cache trust: entries are read safely (no links, no FIFOs, bounded), folders
and key files must be private, entries are authenticated with the user's key, objects are
checked before the JIT links them, and the folder stays under its size cap (LRU)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime import cache, cache_auth, elf_check
from tracecomp.core.safe_files import UnsafeFile, read_regular

from test_cache import HERE, ROOT, fresh_cache, only_entry, run_model  # noqa: F401  (fixture)

# A child process that compiles `model` (test_cache.py) with the cache folder and key given,
# for the cases that used to hang, abort or run planted code.
CHILD = textwrap.dedent("""
    import json, logging, sys
    sys.path.insert(0, sys.argv[1])
    logging.basicConfig(level=logging.WARNING)
    from test_cache import run_model
    from tracecomp.runtime import cache
    run_model()
    print(json.dumps(cache.settings.stats.__dict__))
""")


def run_child(folder, key_file, timeout=120):
    env = dict(os.environ, TRACECOMP_CACHE_DIR=str(folder), TRACECOMP_CACHE="1",
               TRACECOMP_CACHE_KEY=str(key_file))
    return subprocess.run([sys.executable, "-c", CHILD, str(HERE)], env=env,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ 9: reading files

def test_a_fifo_in_place_of_the_json_does_not_block(fresh_cache, tmp_path):
    run_model()
    _, meta = only_entry(fresh_cache)
    meta.unlink()
    os.mkfifo(meta)
    r = run_child(fresh_cache, os.environ["TRACECOMP_CACHE_KEY"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "not a regular file" in r.stderr and json.loads(r.stdout)["rejected"] == 1


@pytest.mark.parametrize("which", [".json", ".o"])
def test_a_link_to_dev_zero_is_refused_not_read(fresh_cache, which):
    run_model()
    obj, meta = only_entry(fresh_cache)
    target = meta if which == ".json" else obj
    target.unlink()
    target.symlink_to("/dev/zero")
    run_model()                                    # no MemoryError: a rejected entry, recompiled
    assert cache.settings.stats.rejected == 1
    assert not target.is_symlink()                 # the store replaced the link, not /dev/zero


def test_read_regular_limits():
    with pytest.raises(UnsafeFile, match="not a regular file"):
        read_regular("/dev/null", 10)
    with pytest.raises(FileNotFoundError):
        read_regular("/nonexistent/x", 10)


def test_read_regular_refuses_large_files(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(bytes(100))
    with pytest.raises(UnsafeFile, match="more than the 10 allowed"):
        read_regular(big, 10)


# ------------------------------------------------------------------ 10: private folders and keys

def test_a_folder_others_can_write_is_not_used(fresh_cache, caplog):
    fresh_cache.mkdir(mode=0o777)
    os.chmod(fresh_cache, 0o777)
    with caplog.at_level(logging.WARNING, logger="tracecomp.cache"):
        run_model()                                # compiled in memory, the answer checked
    assert "writable by group or others" in caplog.text
    assert cache.settings.stats == cache.CacheStats() and not any(fresh_cache.iterdir())


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_not_used(fresh_cache, caplog):
    fresh_cache.mkdir(mode=0o700)
    os.chown(fresh_cache, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="tracecomp.cache"):
        run_model()
    assert "belongs to user 65534" in caplog.text and cache.settings.stats.stores == 0


def test_new_folders_and_key_files_are_private(tmp_path, monkeypatch):
    folder, key_file = tmp_path / "new" / "cache", tmp_path / "config" / "tracecomp" / "cache.key"
    monkeypatch.setenv(cache_auth.KEY_ENV, str(key_file))
    disk = cache.DiskCache.open(folder)
    assert disk is not None
    assert folder.stat().st_mode & 0o777 == 0o700
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == cache_auth.KEY_BYTES
    assert cache_auth.user_key() == key_file.read_bytes()          # made once, then read


def test_a_key_file_others_can_write_turns_the_cache_off(tmp_path, monkeypatch, caplog):
    key_file = tmp_path / "cache.key"
    key_file.write_bytes(os.urandom(32))
    os.chmod(key_file, 0o666)
    monkeypatch.setenv(cache_auth.KEY_ENV, str(key_file))
    with caplog.at_level(logging.WARNING, logger="tracecomp.cache"):
        assert cache.DiskCache.open(tmp_path / "c") is None
    assert "writable by group or others" in caplog.text


def plant(entry_obj, entry_meta, donor_obj, donor_meta, key: bytes) -> None:
    """Put the donor's object code under the entry's key, with a JSON that agrees with it,
    authenticated with `key`."""
    meta = json.loads(donor_meta.read_text())
    meta["key"] = json.loads(entry_meta.read_text())["key"]
    meta["hmac"] = cache_auth.sign(key, meta, donor_obj.read_bytes())
    entry_obj.write_bytes(donor_obj.read_bytes())
    entry_meta.write_text(json.dumps(meta))


def test_an_entry_planted_without_the_key_is_not_run(fresh_cache, tmp_path):
    """The probe's attack: an entry whose JSON agrees with its object code, for x * 3, under
    the key of x * 2; written by someone without this user's key."""
    x = np.arange(4, dtype=np.float32)

    double, triple = (lambda x: x * 2), (lambda x: x * 3)    # one line: the same kernel names
    tc.trace(triple)(x)
    donor_obj, donor_meta = only_entry(fresh_cache)
    moved = tmp_path / "donor"
    moved.mkdir()
    donor_obj, donor_meta = donor_obj.rename(moved / "d.o"), donor_meta.rename(moved / "d.json")
    tc.trace(double)(x)
    obj, meta = only_entry(fresh_cache)
    plant(obj, meta, donor_obj, donor_meta, key=os.urandom(32))        # another user's key
    assert tc.trace(double)(x).numpy().tolist() == [0, 2, 4, 6]
    assert cache.settings.stats.rejected == 1
    plant(obj, meta, donor_obj, donor_meta, key=cache_auth.user_key())  # a holder of the key can
    assert tc.trace(double)(x).numpy().tolist() == [0, 3, 6, 9]


# ------------------------------------------------------------------ 7: objects the JIT links

def test_a_scrambled_object_with_a_valid_hmac_never_reaches_llvm(fresh_cache):
    """Object code damaged by a holder of the key (size, sha256 and HMAC all updated): the
    ELF check refuses it in this process; before, LLVM's linker aborted the process."""
    run_model()
    obj, meta = only_entry(fresh_cache)
    data = bytearray(obj.read_bytes())
    data[40:48] = (len(data) + 4096).to_bytes(8, "little")     # section headers past the end
    m = json.loads(meta.read_text())
    m.update(object_size=len(data), object_sha256=__import__("hashlib").sha256(bytes(data)).hexdigest())
    m["hmac"] = cache_auth.sign(cache_auth.user_key(), m, bytes(data))
    obj.write_bytes(bytes(data))
    meta.write_text(json.dumps(m))
    r = run_child(fresh_cache, os.environ["TRACECOMP_CACHE_KEY"])
    assert r.returncode == 0, r.stderr
    assert "section headers" in r.stderr and json.loads(r.stdout)["rejected"] == 1


def test_elf_check_of_objects():
    from test_cache import OBJECT
    elf_check.check_object(OBJECT)
    with pytest.raises(elf_check.ElfError, match="not an ELF file"):
        elf_check.check_object(b"\x7fELX" + bytes(100))
    with pytest.raises(elf_check.ElfError, match="past the end"):
        elf_check.check_object(OBJECT[:200])


# ------------------------------------------------------------------ the size cap (issue 11)

def test_the_folder_stays_under_its_cap_least_recently_used_first(fresh_cache, monkeypatch):
    x = np.arange(4, dtype=np.float32)
    fns = [lambda x, k=k: x * float(k) + 1.0 for k in range(5)]
    tc.trace(fns[0])(x)
    one = sum(p.stat().st_size for p in only_entry(fresh_cache))
    monkeypatch.setattr(cache.settings, "_max_bytes", int(3.5 * one))
    for f in fns[1:3]:
        tc.trace(f)(x)
    tc.trace(fns[0])(x)                            # a hit: now the most recently used
    assert cache.settings.stats.hits == 1
    tc.trace(fns[3])(x)                            # over the cap: fns[1], the oldest, goes
    assert cache.settings.stats.evicted == 1
    hits = cache.settings.stats.hits
    tc.trace(fns[0])(x)
    assert cache.settings.stats.hits == hits + 1   # kept
    tc.trace(fns[1])(x)
    assert cache.settings.stats.hits == hits + 1   # evicted: compiled again


def test_the_cap_comes_from_the_environment(monkeypatch):
    monkeypatch.setattr(cache.settings, "_max_bytes", None)
    monkeypatch.setenv(cache.MAX_BYTES_ENV, "12345")
    assert tc.compile_cache.max_bytes == 12345
    monkeypatch.delenv(cache.MAX_BYTES_ENV)
    assert tc.compile_cache.max_bytes == 1 << 30
    with pytest.raises(ValueError):
        tc.compile_cache.max_bytes = -1


def test_an_entry_evicted_while_read_is_a_miss(fresh_cache):
    run_model()
    obj, meta = only_entry(fresh_cache)
    disk = cache.DiskCache.open(fresh_cache)
    obj.unlink()                                   # another process evicts between the reads
    assert disk.load(meta.stem) is None
