"""The on-disk compile cache (tracecomp/runtime/cache.py): hits and misses in one process
and across fresh ones, the switches, the folder, damaged entries, the key, concurrent
writers, and no pickle."""
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime import cache, jit
from tracecomp.lower.llvm import target
from tracecomp.runtime import tuning

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent      # this folder: fresh processes import this module from it


def model(x, w):
    """A matmul (packed kernel, parallel through libgomp) and a fused elementwise tail."""
    return tc.tanh(x @ w + 1.0).sum(dim=1)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((256, 64)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)


def expected(x, w):
    return np.tanh(x.astype(np.float64) @ w + 1.0).sum(axis=1)


def run_model(seed=0):
    x, w = inputs(seed)
    out = np.asarray(tc.trace(model)(x, w))
    np.testing.assert_allclose(out, expected(x, w), rtol=1e-5, atol=1e-5)
    return out


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder of the test's own, the cache on, counters at zero.  The process
    has made its tuning choices before (in the run's own folder), as after any earlier
    test, so that a test run alone does not see the tuning record written into its folder."""
    tuning.ensure_tuned()
    monkeypatch.setattr(cache.settings, "_directory", tmp_path / "cache")
    monkeypatch.setattr(cache.settings, "_enabled", None)
    monkeypatch.delenv("TRACECOMP_CACHE", raising=False)
    monkeypatch.setattr(cache.settings, "stats", cache.CacheStats())
    return tmp_path / "cache"


def entries(folder: Path) -> list[Path]:
    """The cache's entry files: not the CPU's tuning record beside them (runtime/tuning.py),
    nor the folder's shared size count (cache.USAGE_FILE)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != cache.USAGE_FILE
                  and not p.relative_to(folder).parts[0].startswith("tuning-"))


def only_entry(folder: Path) -> tuple[Path, Path]:
    objs = [p for p in entries(folder) if p.suffix == ".o"]
    assert len(objs) == 1, entries(folder)
    return objs[0], objs[0].with_suffix(".json")


# ----------------------------------------------------------------------------- hits and misses

def test_second_traced_function_hits(fresh_cache):
    run_model()
    assert cache.settings.stats == cache.CacheStats(misses=1, stores=1)
    obj, meta = only_entry(fresh_cache)
    run_model(seed=1)                      # a new TracedFunction: traced again, code from disk
    assert cache.settings.stats == cache.CacheStats(hits=1, misses=1, stores=1)
    assert len(entries(fresh_cache)) == 2


def test_other_shapes_miss(fresh_cache):
    run_model()
    tc.trace(model)(np.ones((8, 64), np.float32), np.ones((64, 128), np.float32))
    assert cache.settings.stats.misses == 2 and cache.settings.stats.hits == 0


def test_stages_still_print_after_a_hit(fresh_cache):
    run_model()
    x, w = inputs()
    lowered = tc.trace(model).lower(x, w)
    lowered.compiled
    assert cache.settings.stats.hits == 1
    assert "define" in lowered.as_text("llvm") and lowered.as_text("asm").strip()


RUN_IN_FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import test_cache as t
    import tracecomp as tc
    out = t.run_model()
    print(json.dumps({"stats": tc.compile_cache.stats.__dict__, "out": out.tolist()}))
""")


def run_fresh_process(env_extra: dict) -> dict:
    env = dict(os.environ, **env_extra)
    p = subprocess.run([sys.executable, "-c", RUN_IN_FRESH_PROCESS, str(HERE)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fresh_process_hits(tmp_path):
    env = {"TRACECOMP_CACHE_DIR": str(tmp_path / "c"), "TRACECOMP_CACHE": "1"}
    first, second = run_fresh_process(env), run_fresh_process(env)
    assert (first["stats"]["misses"], first["stats"]["hits"]) == (1, 0)
    assert (second["stats"]["misses"], second["stats"]["hits"]) == (0, 1)
    assert first["out"] == second["out"]


# ----------------------------------------------------------------------------- switches and folder

def test_environment_switch_off(fresh_cache, monkeypatch):
    monkeypatch.setenv("TRACECOMP_CACHE", "0")
    assert not cache.settings.enabled
    run_model()
    run_model()
    assert not fresh_cache.exists() and cache.settings.stats == cache.CacheStats()


def test_python_switch_off(fresh_cache):
    tc.compile_cache.enabled = False
    run_model()
    assert not fresh_cache.exists() and cache.settings.stats == cache.CacheStats()
    tc.compile_cache.enabled = None            # back to the environment: on
    run_model()
    assert cache.settings.stats.stores == 1


def test_cache_dir_from_environment(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.setattr(cache.settings, "_directory", None)
    monkeypatch.setenv("TRACECOMP_CACHE_DIR", str(tmp_path / "moved"))
    run_model()
    assert cache.settings.directory == tmp_path / "moved"
    assert len(entries(tmp_path / "moved")) == 2 and not fresh_cache.exists()


def test_default_folder_follows_xdg_and_home(tmp_path, monkeypatch):
    monkeypatch.setattr(cache.settings, "_directory", None)
    monkeypatch.delenv("TRACECOMP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.settings.directory == tmp_path / "xdg" / "tracecomp"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.settings.directory == tmp_path / "home" / ".cache" / "tracecomp"


def test_tests_never_use_the_users_cache():
    assert Path(os.environ["TRACECOMP_CACHE_DIR"]).name.startswith("tracecomp-test-cache-")


def test_unwritable_folder_still_compiles(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(cache.settings, "_directory", blocker / "cache")
    with caplog.at_level(logging.WARNING, logger="tracecomp.cache"):
        run_model()
    assert "not using" in caplog.text and "Not a directory" in caplog.text


def test_clear(fresh_cache):
    run_model()
    tc.compile_cache.clear()
    assert entries(fresh_cache) == []
    run_model()
    assert cache.settings.stats.misses == 2


# ----------------------------------------------------------------------------- damaged entries

def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 3])


def unknown_library(path: Path) -> None:
    meta = json.loads(path.read_text())
    meta["system_libraries"] = ["evil"]
    path.write_text(json.dumps(meta))


def renamed_export(path: Path) -> None:
    meta = json.loads(path.read_text())
    meta["exports"][0] = meta["exports"][0][:-1] + "x"
    path.write_text(json.dumps(meta))


def deeply_nested(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def other_key(path: Path) -> None:
    meta = json.loads(path.read_text())
    meta["key"] = "0" * 64
    path.write_text(json.dumps(meta))


DAMAGE = {"object bytes flipped": (".o", flip_a_byte), "object truncated": (".o", truncate),
          "object deleted": (".o", Path.unlink), "metadata truncated": (".json", truncate),
          "metadata not json": (".json", lambda p: p.write_bytes(b"\x80garbage")),
          "unknown system library": (".json", unknown_library), "key mismatch": (".json", other_key),
          "export renamed": (".json", renamed_export), "metadata nested too deep": (".json", deeply_nested)}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_entry_is_recompiled(fresh_cache, damage, caplog):
    run_model()
    obj, meta = only_entry(fresh_cache)
    suffix, spoil = DAMAGE[damage]
    spoil(obj if suffix == ".o" else meta)
    with caplog.at_level(logging.WARNING, logger="tracecomp.cache"):
        run_model()                            # checks the result against NumPy
    deleted = damage == "object deleted"      # a vanished object is a miss (eviction does that)
    assert cache.settings.stats == cache.CacheStats(misses=2, stores=2, rejected=0 if deleted else 1)
    assert deleted or "unusable" in caplog.text
    assert cache.DiskCache.open(fresh_cache).load(obj.stem) is not None      # rewritten whole
    run_model()
    assert cache.settings.stats.hits == 1


def test_object_that_does_not_link_is_recompiled(fresh_cache):
    run_model()
    obj, meta = only_entry(fresh_cache)
    junk = b"\x7fELF" + bytes(200)             # right size and sha256 in the metadata, not an object
    obj.write_bytes(junk)
    m = json.loads(meta.read_text())
    m.update(object_size=len(junk), object_sha256=hashlib.sha256(junk).hexdigest())
    meta.write_text(json.dumps(m))
    run_model()
    assert cache.settings.stats.rejected == 1 and cache.settings.stats.stores == 2


# ----------------------------------------------------------------------------- the key

def key_for(**host_changes):
    x, w = inputs()
    program = tc.trace(model).lower(x, w).program
    host = dataclasses.replace(target.host_target(), **host_changes)
    return cache.key_parts(program.kernels, "tc_model", align=None, host=host)


def test_key_covers_each_part():
    base = key_for()
    assert base.digest() == key_for().digest()            # deterministic
    assert base.source_hash == cache.source_hash() and len(base.source_hash) == 64
    assert key_for(features=target.host_target().features + ",-avx512f").digest() != base.digest()
    assert key_for(cpu="generic").digest() != base.digest()
    for name, value in [("kernels", base.kernels.replace("float32", "float64", 1)), ("opt", 3),
                        ("llvmlite_version", "0.0"), ("tracecomp_version", "0.0.1"),
                        ("source_hash", "0" * 64), ("options", "align=64"), ("triple", "x")]:
        assert dataclasses.replace(base, **{name: value}).digest() != base.digest(), name


def test_loop_ir_showing_an_address_is_not_cached(fresh_cache, monkeypatch, caplog):
    real = cache.key_parts
    monkeypatch.setattr(cache, "key_parts",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), kernels="[<object at 0x7f01>]"))
    with caplog.at_level(logging.WARNING, logger="tracecomp.cache"):
        run_model()
    assert "object address" in caplog.text
    assert not fresh_cache.exists() and cache.settings.stats == cache.CacheStats()


def test_other_cpu_features_miss(fresh_cache, monkeypatch):
    run_model()
    host = target.host_target()
    monkeypatch.setattr(target, "host_target", lambda: dataclasses.replace(host, features=host.features + ",-avx2"))
    run_model()
    assert cache.settings.stats.misses == 2 and cache.settings.stats.hits == 0


def test_source_hash_covers_the_lowering_and_the_table():
    from tracecomp.ops.table import table_path
    import tracecomp.lower.llvm.codegen as codegen
    files = {p.resolve() for p in cache.source_files()}
    for path in (codegen.__file__, cache.__file__, jit.__file__, table_path("ops.yaml")):
        assert Path(path).resolve() in files


# ----------------------------------------------------------------------------- concurrency

def test_concurrent_processes(tmp_path):
    """Four fresh processes compile the same function into one empty folder at once."""
    env = dict(os.environ, TRACECOMP_CACHE_DIR=str(tmp_path / "c"), TRACECOMP_CACHE="1")
    procs = [subprocess.Popen([sys.executable, "-c", RUN_IN_FRESH_PROCESS, str(HERE)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["out"] == results[0]["out"] for r in results)
    obj, meta = only_entry(tmp_path / "c")
    key = obj.stem
    assert cache.DiskCache.open(tmp_path / "c").load(key) is not None
    assert not [p for p in entries(tmp_path / "c") if p.suffix == ".tmp"]
    assert run_fresh_process({"TRACECOMP_CACHE_DIR": str(tmp_path / "c"), "TRACECOMP_CACHE": "1"})["stats"]["hits"] == 1


def small_object() -> bytes:
    """A real ELF object (what the JIT links), padded to 1 MiB so that reads and writes race."""
    module = target.parse("define i32 @f() {\n  ret i32 0\n}\n", "m")
    return target.emit_object(module, target.host_target_machine()) + bytes(1 << 20)


OBJECT = small_object()

STORE_LOOP = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[4])
    from test_cache import OBJECT
    from pathlib import Path
    from tracecomp.runtime import cache, jit
    folder, key, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    parts = cache.key_parts([], "m", align=None)
    code = jit.ObjectCode(OBJECT, ("f",), ("gomp",))
    disk = cache.DiskCache.open(folder)
    for _ in range(n):
        disk.store(key, code, parts, 1 << 40)
""")


def test_readers_never_see_a_partial_entry(tmp_path):
    """Two processes rewrite one 1 MiB entry 100 times each while this one reads it."""
    key = "ab" * 32
    disk = cache.DiskCache.open(tmp_path)
    writers = [subprocess.Popen([sys.executable, "-c", STORE_LOOP, str(tmp_path), key, "100", str(HERE)],
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    seen = 0
    while any(w.poll() is None for w in writers):
        code = disk.load(key)                 # CorruptEntry here would fail the test
        if code is not None:
            assert code.object == OBJECT and code.system_libraries == ("gomp",)
            seen += 1
    for w in writers:
        assert w.wait() == 0, w.stderr.read()
    assert disk.load(key) is not None and seen > 0


def test_threads_share_one_entry(fresh_cache):
    x, w = inputs()
    lowered = [tc.trace(model).lower(x, w) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda lo: lo.compiled, lowered))
    outs = [np.asarray(lo.run([x, w])) for lo in lowered]
    assert all(np.array_equal(o, outs[0]) for o in outs)
    assert len(entries(fresh_cache)) == 2
    assert cache.settings.stats.hits + cache.settings.stats.misses == 4


# ----------------------------------------------------------------------------- no pickle

def test_entries_are_an_object_and_json(fresh_cache):
    run_model()
    obj, meta = only_entry(fresh_cache)
    assert obj.read_bytes()[:4] == b"\x7fELF"
    m = json.loads(meta.read_text())
    assert m["object_sha256"] == hashlib.sha256(obj.read_bytes()).hexdigest()
    assert m["system_libraries"] == ["gomp"] and m["exports"]
    assert {p.suffix for p in entries(fresh_cache)} == {".o", ".json"}


def test_no_pickle_in_the_cache_code():
    for module in (cache, jit):
        text = Path(module.__file__).read_text()
        for word in ("pickle", "marshal", "shelve", "eval(", "exec("):
            assert word not in text, (module.__name__, word)


# ----------------------------------------------------------------------------- one function per distinct kernel

def test_kernels_that_compute_the_same_on_other_buffers_compile_once():
    """Each parameter's update of one shape is the same kernel on other buffers: one function
    in the library, the other kernels' names its aliases, the results those of each kernel."""
    def updates(w1, w2, w3, g1, g2, g3):
        return [w - 0.1 * tc.tanh(g) for w, g in ((w1, g1), (w2, g2), (w3, g3))]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((33, 7)).astype(np.float32) for _ in range(6)]
    traced = tc.trace(updates)
    got = traced(*args)
    lowered = traced.lower(*args)
    kernels = lowered.program.kernels
    library = lowered.compiled.library
    assert len(kernels) == 3 and len(library.symbols) == 1
    assert {k.name for k in kernels} - set(library.symbols) == set(library.aliases)
    for out, w, g in zip(got, args[:3], args[3:]):
        np.testing.assert_allclose(out.numpy(), w - np.float32(0.1) * np.tanh(g), rtol=1e-6, atol=1e-6)


def test_the_shape_text_ignores_names_but_not_shapes_or_dtypes():
    from tracecomp.lower.loops.walk import kernel_shape_text
    def program(shape, dtype):
        x = np.ones(shape, dtype)
        return tc.trace(lambda a, b: (a * 2, b * 2)).lower(x, x).program.kernels
    a, b = program((4, 5), np.float32)
    assert kernel_shape_text(a) == kernel_shape_text(b) and a.name != b.name
    assert kernel_shape_text(program((4, 6), np.float32)[0]) != kernel_shape_text(a)
    assert kernel_shape_text(program((4, 5), np.float64)[0]) != kernel_shape_text(a)


def test_a_compile_served_from_the_cache_means_hits_and_no_miss():
    """The demos say 'machine code from the compile cache' only when every lookup since the
    first call began hit: the plan runner's hit beside a program's missed kernels does not."""
    from tracecomp.runtime.cache import CacheStats
    stats = CacheStats()
    before = stats.copy()
    assert not stats.only_hits_since(before)
    stats.hits += 2
    assert stats.only_hits_since(before)
    stats.misses += 1
    assert not stats.only_hits_since(before)
