"""The global random generator behind tc.rand / tc.randn, reseeded by tc.manual_seed."""
from __future__ import annotations

import numpy as np

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Make tc.rand/tc.randn (eager and traced) repeat the same sequence."""
    global _generator
    _generator = np.random.default_rng(int(seed))


def generator() -> np.random.Generator:
    return _generator
