"""tracecomp imported before NumPy shortens the spin of NumPy's idle OpenBLAS threads
(numpy_blas.py), for NumPy's loading only; imported after NumPy, or with the user's own
OPENBLAS_THREAD_TIMEOUT, it leaves OpenBLAS as it is, and `tracecomp info` says which."""
import os
import subprocess
import sys

import pytest

from tracecomp.runtime import numpy_blas

if numpy_blas.openblas_spin() is None:
    pytest.skip("NumPy's BLAS here is not an OpenBLAS that reports its spin", allow_module_level=True)

READ = ("import os, tracecomp.runtime.numpy_blas as b\n"
        "print(b.openblas_spin(), os.environ.get('OPENBLAS_THREAD_TIMEOUT'), '|', b.describe())\n")


def run(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_imported_first_it_shortens_the_spin_for_numpys_loading_only():
    out = run("import tracecomp\n" + READ)
    assert out.startswith(f"{numpy_blas.SHORT_SPIN} None |") and "set by tracecomp" in out


def test_imported_after_numpy_it_changes_nothing_and_says_so():
    out = run("import numpy, tracecomp\n" + READ)
    assert out.startswith(f"{numpy_blas.DEFAULT_SPIN} None |") and "NumPy was loaded before tracecomp" in out


def test_the_users_setting_wins():
    out = run("import tracecomp\n" + READ, OPENBLAS_THREAD_TIMEOUT="20")
    assert out.startswith("20 20 |") and "set by the user" in out


# ---------------------------------------------------------------- OpenBLAS on tracecomp's team
# Imported after NumPy, tracecomp runs OpenBLAS's jobs on its own threads (runtime/blas_team.py).

BATTERY = """
import numpy as np
def battery():
    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((700, 500), dtype=np.float32); b32 = rng.standard_normal((500, 300), dtype=np.float32)
    a = rng.standard_normal((300, 300)); s = a @ a.T + 300 * np.eye(300)
    z = a + 1j * rng.standard_normal((300, 300))
    return [a32 @ b32, a32.T @ a32, a @ a, z @ z, a @ a[:, 0], np.linalg.inv(a), np.linalg.solve(a, a[:, :7]),
            np.linalg.cholesky(s), np.linalg.eigh(s)[0], np.linalg.svd(a)[1], np.linalg.qr(a)[1],
            np.linalg.lstsq(a[:, :200], a[:, 0], rcond=None)[0], np.linalg.det(a)]
"""
SHARE = ("import tracecomp as tc, tracecomp.runtime.numpy_blas as nb, ctypes\n"
         "x = np.ones((512, 512), np.float32)\n"
         "tc.trace(lambda p, q: p @ q)(x, x)     # tracecomp's first team: OpenBLAS joins it\n"
         "from tracecomp.runtime import blas_team\n"
         "callbacks = {lib.address(blas_team.CALLBACK) for lib in blas_team._libraries}\n"
         "def installed(path):\n"
         "    return ctypes.c_void_p.in_dll(nb.openblas(path), 'openblas_threads_callback_').value in callbacks\n"
         "assert nb.openblas_library() in nb.shared and installed(nb.openblas_library())\n")


def same(before, after):
    """Bit for bit: the jobs are OpenBLAS's own, split as before, only run by other threads."""
    import numpy as np
    return all(np.array_equal(x, y) for x, y in zip(before, after))


def test_imported_after_numpy_its_team_runs_openblass_jobs_with_the_same_results():
    out = run("import numpy\n" + BATTERY + "before = battery()\n" + SHARE +
              f"from {__name__} import same\n"
              "print(same(before, battery()), '|', nb.describe())", PYTHONPATH=os.path.dirname(__file__))
    assert out.startswith("True |") and "its jobs run on tracecomp's threads" in out, out


def test_shared_openblas_from_threads_with_a_smaller_team_and_in_a_forked_child():
    code = ("import numpy\n" + BATTERY + "before = battery()\n" + SHARE +
            f"from {__name__} import same\n"
            "import os, threading\n"
            "from tracecomp.runtime import jit\n"
            "results = []\n"
            "def work():\n"
            "    for _ in range(3): results.append(same(before, battery()))\n"
            "threads = [threading.Thread(target=work) for _ in range(4)]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "with jit.one_thread():                 # a team of one: the other job gets a thread\n"
            "    results.append(same(before, battery()))\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(0 if same(before, battery()) else 3)\n"
            "results.append(os.waitpid(pid, 0)[1] == 0)\n"
            "print(len(results), all(results))")
    assert run(code, PYTHONPATH=os.path.dirname(__file__)) == "14 True"


@pytest.mark.parametrize("first, env, why", [
    ("import tracecomp, numpy", {}, "spin 2^16 cycles only"),
    ("import numpy, tracecomp", {"TRACECOMP_SHARE_BLAS_THREADS": "0"}, "TRACECOMP_SHARE_BLAS_THREADS=0"),
    ("import numpy, tracecomp", {"OPENBLAS_THREAD_TIMEOUT": "20"}, "set by the user")])
def test_openblas_keeps_its_own_threads_when_it_need_not_or_may_not_share(first, env, why):
    code = (f"{first}\nimport numpy as np\n" + SHARE.split("from tracecomp.runtime")[0] +
            "print(bool(nb.shared), '|', nb.why_not_share())")
    out = run(code, **env)
    assert out.startswith("False |") and why in out, out


def test_the_callback_runs_all_jobs_at_once_on_distinct_slots():
    """The callback itself, with jobs that wait for each other (as a level-3 GEMM's do): n
    jobs on a full team, on a team of one, and from two calls at once, each job on a slot no
    job in flight holds, the highest first."""
    import ctypes
    import threading

    from tracecomp.runtime import blas_team, jit

    max_threads = 8
    library = jit.compile_module(blas_team.module_text(max_threads), [blas_team.CALLBACK])
    callback = library.function(blas_team.CALLBACK, None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int)
    JOB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
    seen, lock = [], threading.Lock()

    def calls(n: int, barrier: threading.Barrier):
        queue = (ctypes.c_int64 * n)(*range(100, 100 + n))

        def job(slot, entry, arg):
            with lock:
                seen.append((slot, ctypes.c_int64.from_address(entry).value, arg))
            barrier.wait(timeout=20)       # raises (and the count below fails) unless all run at once

        return lambda: callback(1, ctypes.cast(JOB(job), ctypes.c_void_p), n, 8,
                                ctypes.cast(queue, ctypes.c_void_p), 7)

    calls(3, threading.Barrier(3))()
    assert sorted(s for s, _, _ in seen) == [5, 6, 7] and sorted(e for _, e, _ in seen) == [100, 101, 102]
    assert {arg for _, _, arg in seen} == {7}
    seen.clear()
    with jit.one_thread():
        calls(4, threading.Barrier(4))()
    assert sorted(e for _, e, _ in seen) == [100, 101, 102, 103] and len({s for s, _, _ in seen}) == 4
    seen.clear()
    both = threading.Barrier(6)        # two calls of three jobs, all six running at once
    threads = [threading.Thread(target=calls(3, both)) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(seen) == 6 and sorted(s for s, _, _ in seen) == [2, 3, 4, 5, 6, 7]


def test_scipys_own_openblas_shares_too_loaded_before_or_after_tracecomps_first_team():
    """SciPy's wheels bring a second OpenBLAS: each copy gets a callback of its own, also one
    loaded after tracecomp first linked parallel code (it is looked for at every link)."""
    pytest.importorskip("scipy", reason="scipy not installed")
    scipy_battery = ("import scipy.linalg as sl\n"
                     "def scipy_battery():\n"
                     "    rng = np.random.default_rng(1)\n"
                     "    a = rng.standard_normal((400, 400)); s = a @ a.T + 400 * np.eye(400)\n"
                     "    f = rng.standard_normal((600, 500), dtype=np.float32)\n"
                     "    return [sl.blas.dgemm(1.0, a, a), sl.blas.sgemm(1.0, f, f.T), sl.solve(a, a[:, :5]),\n"
                     "            sl.eigh(s)[0], sl.svd(a)[1], sl.cholesky(s), sl.lu_factor(a)[0]]\n")
    for scipy_first in (True, False):
        before = "before = battery()\n"
        scipy_before = scipy_battery + "scipy_before = scipy_battery()\n"     # on OpenBLAS's own threads
        code = ("import numpy\n" + BATTERY + (scipy_before + before + SHARE if scipy_first else
                                              before + SHARE + scipy_before) +
                "tc.trace(lambda p, q: p @ q + 1)(x, x)          # links more parallel code\n"
                f"from {__name__} import same\n"
                "scipy_path = [p for p in nb.openblas_libraries() if 'scipy' in p][0]\n"
                "print(same(before, battery()), same(scipy_before, scipy_battery()),\n"
                "      installed(scipy_path), len(nb.shared), '|', nb.describe())")
        out = run(code, PYTHONPATH=os.path.dirname(__file__))
        assert out.startswith("True True True 2 |") and "also on tracecomp's threads: libscipy_openblas" in out, out
