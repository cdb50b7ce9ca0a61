"""The measured choices of runtime/tuning.py: on an AVX-512 CPU, whether the matmul's tiles
and the loops LLVM vectorizes use 512- or 256-bit vectors, measured once per CPU, stored in
the compile cache's folder, read back by later processes, applied to every tile and loop of
the process, and skipped where there is nothing to choose (an AVX2 target) or nowhere to
keep it (TRACECOMP_TUNE=0)."""
import json
import os
import subprocess
import sys

import pytest

from tracecomp.lower.llvm import target
from tracecomp.runtime import tuning

PROBE = ("import json, numpy as np, tracecomp as tc\n"
         "from tracecomp.lower import hostcpu\n"
         "from tracecomp.runtime import tuning\n"
         "from tracecomp.lower.schedule.tiles import host_tiles\n"
         "from tracecomp.core.dtypes import DType\n"
         "a, b = np.arange(70 * 90, dtype=np.float32).reshape(70, 90) % 7, np.ones((90, 50), np.float32)\n"
         "f = tc.trace(lambda a, b: a @ b)\n"
         "np.testing.assert_array_equal(np.asarray(f(a, b)), a @ b)\n"
         "llvm = f.lower(a, b).as_text('llvm')\n"
         "lanes = host_tiles()[DType.float32].lanes\n"
         "asm = tc.trace(lambda x: x * 2.0 + 1.0).lower(np.ones(1 << 14, np.float32)).as_text('asm')\n"
         "loop_register = next(r for r in ('zmm', 'ymm', 'xmm') if f'%{r}' in asm)\n"
         "print(json.dumps({'lanes': lanes, 'fma': f'@llvm.fma.v{lanes}f32' in llvm, 'tuned': hostcpu.tuned(),\n"
         "                  'loop_register': loop_register, 'record': str(tuning.record_path())}))\n")
REGISTER = {64: "zmm", 32: "ymm"}


def probe(cache_dir, tuning_dir=None, **env):
    """The PROBE's findings in a fresh process on `cache_dir`, whose host tuning folder is
    `tuning_dir` (default: the cache folder itself, so that nothing is found elsewhere)."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRACECOMP_CACHE_DIR": str(cache_dir),
                              "TRACECOMP_TUNING_DIR": str(tuning_dir or cache_dir), **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def needs_avx512():
    if not target.host_target().has("avx512f"):
        pytest.skip("nothing to measure: the target has no AVX-512 (the tiles take its widest vectors)")


def test_the_choice_is_measured_once_stored_and_read_back(tmp_path):
    needs_avx512()
    first = probe(tmp_path)
    tuned = first["tuned"]
    assert tuned["matmul_vector_bytes"] in (64, 32) and tuned["loop_vector_bytes"] in (64, 32)
    assert {probe: set(times) for probe, times in tuned["measured_ms"].items()} == {"matmul": {"512", "256"},
                                                                                   "loop": {"512", "256"}}
    assert first["lanes"] == tuned["matmul_vector_bytes"] // 4 and first["fma"]
    assert first["loop_register"] == REGISTER[tuned["loop_vector_bytes"]]
    record = tmp_path / first["record"].split(str(tmp_path) + "/", 1)[1]
    stamp = record.stat().st_mtime_ns
    second = probe(tmp_path)
    assert second["tuned"] == first["tuned"] and record.stat().st_mtime_ns == stamp      # read, not measured


def test_a_fresh_cache_folder_takes_the_hosts_record_instead_of_measuring(tmp_path):
    """The record lives in the host's tuning folder too, so a process on a new compile cache
    folder (a project's, a test's) finds it there, copies it beside its cache and measures
    nothing: measuring was most of a cold first call."""
    needs_avx512()
    host = tmp_path / "host"
    first = probe(tmp_path / "first", tuning_dir=host)
    assert "measured_ms" in first["tuned"]
    record = host / first["record"].split(str(tmp_path / "first") + "/", 1)[1]
    # a record no measurement would give (256-bit matmul, 512-bit loops) tells it was read
    choices = {"matmul_vector_bytes": 32, "loop_vector_bytes": 64}
    record.write_text(json.dumps(choices))
    fresh = probe(tmp_path / "fresh", tuning_dir=host)
    assert fresh["tuned"] == choices and fresh["lanes"] == 8 and fresh["loop_register"] == "zmm"
    assert json.loads(open(fresh["record"]).read()) == choices        # left beside the new cache


def test_a_stored_choice_applies_to_every_tile_and_loop(tmp_path):
    """A record saying 256-bit gives 8-lane float32 tiles and ymm loops on an AVX-512 CPU, and
    right results; one saying 512-bit gives zmm loops where LLVM's model of the CPU prefers
    256-bit ones (rocketlake's)."""
    needs_avx512()
    for target_name, width in (("host", 32), ("rocketlake", 64)):
        folder = tmp_path / target_name
        untuned = probe(folder, TRACECOMP_TUNE="0", TRACECOMP_TARGET=target_name)
        os.makedirs(os.path.dirname(untuned["record"]), exist_ok=True)
        choices = {"matmul_vector_bytes": width, "loop_vector_bytes": width}
        with open(untuned["record"], "w") as f:
            json.dump(choices, f)
        got = probe(folder, TRACECOMP_TARGET=target_name)
        assert got["lanes"] == width // 4 and got["fma"] and got["tuned"] == choices
        assert got["loop_register"] == REGISTER[width]
        if target_name == "rocketlake":
            assert untuned["loop_register"] == "ymm"      # LLVM's own choice for rocketlake


FIRST_DUMP = ("import json, sys, numpy as np, tracecomp as tc\n"
              "from tracecomp.runtime import tuning\n"
              "record = tuning.record_path()\n"
              "record.parent.mkdir(parents=True, exist_ok=True)\n"
              "record.write_text(sys.argv[1])\n"
              "asm = tc.trace(lambda x: x * 2.0 + 1.0).lower(np.ones(1 << 14, np.float32)).as_text('asm')\n"
              "print(json.dumps({'zmm': '%zmm' in asm, 'ymm': '%ymm' in asm}))\n")


def test_the_first_dump_of_a_process_follows_the_stored_choice(tmp_path):
    """A dump as the first compile of a process: the kernels are scheduled (which installs
    the stored choices) before the target machine is built.  It was built first, so that an
    Intel host's first `as_text("asm")` showed LLVM's own 256-bit loops under a 512-bit record."""
    needs_avx512()
    for target_name, width in (("rocketlake", 64), ("host", 32)):
        choices = json.dumps({"matmul_vector_bytes": width, "loop_vector_bytes": width})
        out = subprocess.run([sys.executable, "-c", FIRST_DUMP, choices], capture_output=True, text=True,
                             timeout=300, env={**os.environ, "TRACECOMP_CACHE_DIR": str(tmp_path / target_name),
                                               "TRACECOMP_TARGET": target_name})
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got == {"zmm": width == 64, "ymm": width == 32}, (target_name, width, got)


def test_a_record_that_is_not_a_known_choice_is_measured_again(tmp_path):
    needs_avx512()
    record = probe(tmp_path, TRACECOMP_TUNE="0")["record"]
    os.makedirs(os.path.dirname(record), exist_ok=True)
    for bad in ('{"matmul_vector_bytes": 128, "loop_vector_bytes": 64}', '{"matmul_vector_bytes": 64}',
                "not json", "[64]"):
        with open(record, "w") as f:
            f.write(bad)
        got = probe(tmp_path)
        assert got["tuned"]["matmul_vector_bytes"] in (64, 32) and "measured_ms" in got["tuned"]


def test_nothing_is_measured_without_a_choice_or_without_a_place_to_keep_it(tmp_path):
    off = probe(tmp_path / "off", TRACECOMP_TUNE="0")
    assert off["tuned"] == {} and not os.path.exists(off["record"])
    assert off["lanes"] == (16 if target.host_target().has("avx512f") else 8 if target.host_target().has("avx") else 4)
    if target.host_target().has("avx2"):
        avx2 = probe(tmp_path / "avx2", TRACECOMP_TARGET="avx2")
        assert avx2["tuned"] == {} and avx2["lanes"] == 8 and not os.path.exists(avx2["record"])
    cache_off = probe(tmp_path / "cache-off", TRACECOMP_CACHE="0")
    assert cache_off["tuned"] == {} and not os.path.exists(cache_off["record"])


def test_the_narrower_width_must_win_by_the_margin():
    assert tuning.decide({64: 1.0, 32: 0.5}) == 32
    assert tuning.decide({64: 1.0, 32: 0.95}) == 64           # within the margin: keep the widest
    assert tuning.decide({64: 0.5, 32: 1.0}) == 64


def test_the_first_stored_record_wins(tmp_path, monkeypatch):
    """Processes that measured at the same time all take the record stored first, so every
    process sharing a cache folder schedules with the same tiles."""
    from tracecomp.runtime import cache
    needs_avx512()
    monkeypatch.setattr(cache.settings, "_directory", tmp_path)
    first = tuning.store_record({"matmul_vector_bytes": 64, "loop_vector_bytes": 64})
    second = tuning.store_record({"matmul_vector_bytes": 32, "loop_vector_bytes": 32})
    assert first == second == tuning.load_record() and first["matmul_vector_bytes"] == 64
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_probes_are_the_programs_tc_trace_makes_of_their_functions():
    """measure() and `tracecomp info` compile their probes from graph text (tc.trace lies
    above runtime/): the text must schedule to the loops tc.trace gives the functions it
    stands for, or they would measure (or report the registers of) other code."""
    import numpy as np

    import tracecomp as tc
    from tracecomp.lower.loops.walk import kernel_shape_text
    from tracecomp.runtime import host
    square = np.ones((tuning.PROBE_N, tuning.PROBE_N), np.float32)
    for text, fn, args in ((tuning.MATMUL_PROBE, lambda a, b: a @ b, (square, square)),
                           (tuning.LOOP_PROBE, lambda x: x * (1.702 * x).sigmoid() + x.sin() * (-x * x).exp(),
                            (np.ones(tuning.LOOP_PROBE_N, np.float32),)),
                           (host.REGISTER_PROBE, lambda x: x * 2.0 + 1.0, (np.ones(1 << 14, np.float32),))):
        traced = tc.trace(fn).lower(*args).program.kernels
        assert [kernel_shape_text(k) for k in tuning.probe_program(text).kernels] == \
            [kernel_shape_text(k) for k in traced]


def test_measuring_puts_the_process_setting_back():
    """The probes are scheduled and compiled under each candidate width in turn; the
    process's own choices are untouched afterwards (ensure_tuned installs the measured ones)."""
    from tracecomp.lower import hostcpu
    needs_avx512()
    before = hostcpu.tuned()
    measured = tuning.measure()
    assert hostcpu.tuned() == before
    assert {measured["matmul_vector_bytes"], measured["loop_vector_bytes"]} <= {64, 32}


MOVED = ("import sys, numpy as np, tracecomp as tc\n"
         "tc.trace(lambda x: x + 1.0)(np.ones(8, np.float32))\n"          # reads the record
         "tc.compile_cache.directory = sys.argv[1]\n"
         "tc.trace(lambda x: x * 3.0)(np.ones(8, np.float32))\n")         # compiles into the new folder


def test_a_process_that_moves_its_cache_folder_leaves_its_record_there(tmp_path):
    """The compile cache calls tuning's hook for each folder it uses (cache.folder_used):
    a folder the process moved to gets the process's choices, so that processes starting
    there take the same tiles instead of measuring."""
    needs_avx512()
    choices = {"matmul_vector_bytes": 32, "loop_vector_bytes": 64}      # no measurement gives this
    first = tmp_path / "first"
    record = probe(first, TRACECOMP_TUNE="0")["record"]
    os.makedirs(os.path.dirname(record), exist_ok=True)
    with open(record, "w") as f:
        json.dump(choices, f)
    moved = tmp_path / "moved"
    out = subprocess.run([sys.executable, "-c", MOVED, str(moved)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRACECOMP_CACHE_DIR": str(first), "TRACECOMP_TUNING_DIR": str(first)})
    assert out.returncode == 0, out.stderr
    assert json.loads((moved / os.path.relpath(record, first)).read_text()) == choices
