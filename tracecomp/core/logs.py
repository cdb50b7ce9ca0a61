"""tracecomp's logging: one logger tree under "tracecomp", configured only by TRACECOMP_LOG.

A library must not configure logging for the program that imports it (no `basicConfig`, no
handler on the root logger): the "tracecomp" logger gets a NullHandler, so nothing prints
unless the application configures logging itself.  TRACECOMP_LOG=1 (INFO) or
TRACECOMP_LOG=debug (or 2, DEBUG) attaches one stderr handler to tracecomp's own logger,
for a quick look at retraces and compile times without touching the application's setup.
"""
from __future__ import annotations

import logging
import os

ROOT = "tracecomp"
ENV = "TRACECOMP_LOG"


def _level(setting: str) -> int:
    return logging.DEBUG if setting.strip().lower() in ("debug", "2") else logging.INFO


def configure(setting: str | None = None) -> logging.Logger:
    """Set up the "tracecomp" logger from `setting` (default: $TRACECOMP_LOG); idempotent."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    setting = os.environ.get(ENV, "") if setting is None else setting
    if setting and setting != "0":
        if not any(getattr(h, "_tracecomp_env", False) for h in logger.handlers):
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
            handler._tracecomp_env = True
            logger.addHandler(handler)
        logger.setLevel(_level(setting))
    return logger
