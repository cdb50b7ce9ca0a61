"""Test-wide settings: verify the graph after every compiler pass, not just the last; a
compile cache of the test run's own."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TRACECOMP_VERIFY", "1")

# The compile cache goes to a folder of this test run's own, never the user's; pytest-xdist's
# workers inherit it from the controller process, which deletes it at exit.
if not os.environ.get("TRACECOMP_TEST_CACHE_DIR"):
    _cache_dir = tempfile.mkdtemp(prefix="tracecomp-test-cache-")
    os.environ["TRACECOMP_TEST_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ["TRACECOMP_CACHE_DIR"] = os.environ["TRACECOMP_TEST_CACHE_DIR"]
