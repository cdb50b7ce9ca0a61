"""tracecomp configures only its own logger: importing it leaves the root logger alone,
and TRACECOMP_LOG attaches one handler to the "tracecomp" logger."""
import os
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import logging
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    import numpy as np
    import tracecomp as tc
    assert (list(root.handlers), root.level) == before, (root.handlers, root.level)
    f = tc.trace(lambda x: x * 2)
    f(np.ones(3, np.float32)); f(np.ones(4, np.float32))   # a retrace, logged at INFO
    print("ok")
""")


def _run(env_value):
    env = {k: v for k, v in os.environ.items() if k != "TRACECOMP_LOG"}
    if env_value is not None:
        env["TRACECOMP_LOG"] = env_value
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=120)


def test_import_leaves_root_logger_untouched_and_is_silent():
    r = _run(None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert "tracecomp" not in r.stderr


def test_env_variable_shows_tracecomp_logs_only_through_its_own_logger():
    r = _run("1")
    assert r.returncode == 0, r.stderr
    assert "INFO:tracecomp.transforms.trace:" in r.stderr


def test_configure_is_idempotent():
    import logging
    from tracecomp.core import logs
    logger = logging.getLogger(logs.ROOT)
    before = list(logger.handlers), logger.level
    try:
        logs.configure("1")
        logs.configure("1")
        assert sum(getattr(h, "_tracecomp_env", False) for h in logger.handlers) == 1
        assert logger.level == logging.INFO
        logs.configure("debug")
        assert logger.level == logging.DEBUG
    finally:
        logger.handlers[:] = before[0]
        logger.setLevel(before[1])
