"""The large sample sweeps' split: a representative subset runs by default; the rest is
marked slow, and built only with TRACECOMP_SLOW=1 (conftest.py runs slow tests only then)."""
from __future__ import annotations

import os

import pytest

SLOW = bool(os.environ.get("TRACECOMP_SLOW"))


def sweep(params: list, kept) -> list:
    """`params` (pytest.param objects) where kept(param) holds; with TRACECOMP_SLOW=1 the
    others too, marked slow (otherwise they are not collected at all)."""
    out = []
    for p in params:
        if kept(p):
            out.append(p)
        elif SLOW:
            out.append(pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.slow]))
    return out
