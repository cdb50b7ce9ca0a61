"""The compile cache and the JIT under hostile use (issue 33, item 8): several processes
filling one small cache folder at once, and a function recompiled thousands of times.

Each case runs in child processes, which is what the finding is about (a per-process view
of a shared folder) or what the measurement needs (a process's own resident memory)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracecomp.runtime import cache

# A child that waits for `go`, then compiles FUNCTIONS functions of its own (their constants
# differ, so each is an entry of its own) into the cache folder of its environment.
WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np, tracecomp as tc
    me, go = int(sys.argv[1]), sys.argv[2]
    x = np.arange(8, dtype=np.float32)
    tc.trace(lambda x: x * (0.5 + me))(x)            # warm: imports, tuning and a first store done
    open(go + f".ready{me}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    for k in range(int(sys.argv[3])):
        tc.trace(lambda x, c=float(1000 * me + k): x * c + 1.0)(x)
""")
FUNCTIONS = 8


def folder_bytes(folder: Path) -> tuple[int, int]:
    """(bytes, entries) of the cache's entries: objects and their JSON, as eviction counts them."""
    total, count = 0, 0
    for meta in (folder / f"v{cache.FORMAT}").glob("*/*.json"):
        obj = meta.with_suffix(".o")
        if obj.exists():
            total += meta.stat().st_size + obj.stat().st_size
            count += 1
    return total, count


def test_four_processes_keep_the_folder_under_its_cap(tmp_path):
    folder = tmp_path / "cache"
    env = dict(os.environ, TRACECOMP_CACHE_DIR=str(folder), TRACECOMP_CACHE="1")
    env.pop(cache.MAX_BYTES_ENV, None)
    # One entry's size first, in a folder without a cap, to set the cap at 16 entries: more
    # than the folder holds when the four start (each has stored once) plus what one of them
    # writes next, far fewer than the four write together.
    (tmp_path / "first").touch()                     # a `go` already given
    subprocess.run([sys.executable, "-c", WRITER, "9", str(tmp_path / "first"), "1"], env=env, check=True,
                   timeout=300, capture_output=True)
    one = max(folder_bytes(folder)[0] // 2, 1)       # two entries: the warm one and one more
    cap = 16 * one
    env[cache.MAX_BYTES_ENV] = str(cap)
    go = tmp_path / "go"
    children = [subprocess.Popen([sys.executable, "-c", WRITER, str(i), str(go), str(FUNCTIONS)],
                                 env=env, stderr=subprocess.PIPE, text=True) for i in range(4)]
    deadline = time.monotonic() + 300
    while not all(Path(f"{go}.ready{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()                                       # all four compile from here on at once
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
    total, count = folder_bytes(folder)
    # 2 + 4 x 9 entries were written; the shared count keeps the folder at 16 or fewer
    # (a count of each process's own stores saw at most 5 + 8 and never evicted).
    assert total <= cap or count == 1, f"{total} bytes in {count} entries under a cap of {cap}"


# A child that recompiles one function for ever new scalars, keeping 8 signatures
# (cache_size), and prints its resident memory's growth per compile after a warm-up.
RECOMPILER = textwrap.dedent("""
    import ctypes, gc, os, sys, warnings
    warnings.simplefilter("ignore")                  # the retrace warning
    import numpy as np, tracecomp as tc

    def resident():
        ctypes.CDLL("libc.so.6").malloc_trim(0)      # free pages malloc keeps are slack, not a leak
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def fn(x, w, c):
        h = tc.softmax(x * w[0] * c, dim=-1)
        return (h.exp() * x.sin()).sum(dim=0).tanh()

    f = tc.trace(fn, cache_size=8)
    x, w = np.ones((64, 8), np.float32), np.ones((8, 8), np.float32)
    warm, count = int(sys.argv[1]), int(sys.argv[2])
    for i in range(warm):          # each new Python scalar retraces: the same buffers each time
        f(x, w, float(i))
    gc.collect()
    before = resident()
    for i in range(warm, warm + count):
        f(x, w, float(i))
    gc.collect()
    print((resident() - before) / count)
""")


def test_dropped_signatures_give_their_native_memory_back():
    """Each compile used to leave ~12 KiB resident here: its module's types, constants and
    metadata in llvmlite's global LLVMContext, and an emptied JITDylib (with its code
    pages) in an LLJIT shared by 256 libraries.  What stays is llvmlite's own ~1.5 KiB per
    optimized module (target.py) and some: 1.1 KiB at bd834c4, 1.0-4.7 KiB at later commits,
    varying with the code's layout from commit to commit (heap layout: no Python object
    grows).  malloc's free pages are trimmed before each reading (without that the same code
    read 4-8 KiB); the bound is generous."""
    env = dict(os.environ, TRACECOMP_CACHE="0")      # every call compiles through LLVM
    r = subprocess.run([sys.executable, "-c", RECOMPILER, "100", "200"], env=env, timeout=600,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    per_compile = float(r.stdout.split()[-1])
    assert per_compile < 6 * 1024, f"resident memory grew {per_compile / 1024:.1f} KiB per compile"
