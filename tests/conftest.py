"""Test-wide settings: verify the graph after every compiler pass, not just the last; a
compile cache of the test run's own; slow tests only with TRACECOMP_SLOW=1."""
import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("TRACECOMP_VERIFY", "1")

# The compile cache goes to a folder of this test run's own, never the user's; pytest-xdist's
# workers inherit it from the controller process, which deletes it at exit.
if not os.environ.get("TRACECOMP_TEST_CACHE_DIR"):
    _cache_dir = tempfile.mkdtemp(prefix="tracecomp-test-cache-")
    os.environ["TRACECOMP_TEST_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ["TRACECOMP_CACHE_DIR"] = os.environ["TRACECOMP_TEST_CACHE_DIR"]
# ... and so do the host's tuning records (runtime/tuning.py), found by processes on other folders
os.environ["TRACECOMP_TUNING_DIR"] = os.environ["TRACECOMP_TEST_CACHE_DIR"]
# ... and so does the key that authenticates its entries (never the user's own key file)
os.environ["TRACECOMP_CACHE_KEY"] = os.path.join(os.environ["TRACECOMP_TEST_CACHE_DIR"], "cache.key")


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run only with TRACECOMP_SLOW=1 (the README's default run leaves them out)."""
    if os.environ.get("TRACECOMP_SLOW"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)


@pytest.fixture(params=[64, 32], ids=["512-bit", "256-bit"])
def loop_vector_register(request):
    """Each loop vector width this host can run, forced as the measured choice
    (`loop_vector_bytes`) whatever the host measured: the register class the loops LLVM
    vectorizes must then use.  A test that read the width back from a probe of its own would
    test one CPU's tuning, not that generated code follows the choice."""
    from tracecomp.lower import hostcpu
    from tracecomp.runtime import tuning
    width = request.param
    if not hostcpu.detected_target().has("avx512f" if width == 64 else "avx"):
        pytest.skip(f"the host has no {width * 8}-bit vectors")
    tuning.ensure_tuned()       # measured (or read) first, so that it cannot replace the forced choice
    before = hostcpu.tuned()
    hostcpu.set_tuned({**before, "loop_vector_bytes": width})
    yield {64: "zmm", 32: "ymm"}[width]
    hostcpu.set_tuned(before)


def pytest_terminal_summary(terminalreporter):
    """The PyTorch OpInfo samples skipped as not supported yet, by reason, and their share."""
    def of_opinfo(outcome):
        return [r for r in terminalreporter.stats.get(outcome, [])
                if getattr(r, "when", None) == "call" and r.nodeid.startswith("tests/test_torch_opinfo.py::")]
    skipped = of_opinfo("skipped")
    total = len(skipped) + len(of_opinfo("passed")) + len(of_opinfo("failed"))
    if not total:
        return
    reasons: dict[str, int] = {}
    for r in skipped:
        reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.section("PyTorch OpInfo samples skipped")
    terminalreporter.line(f"{len(skipped)} of {total} sample tests skipped ({100 * len(skipped) / total:.1f}%):")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        terminalreporter.line(f"  {n:5d}  {reason}")
