"""Grad mode: whether ops record autograd history (tc.no_grad / tc.enable_grad)."""
from __future__ import annotations

import contextlib

from ..dispatch import state


def is_grad_enabled() -> bool:
    return state.grad_enabled


@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    old = state.grad_enabled
    state.grad_enabled = bool(mode)
    try:
        yield
    finally:
        state.grad_enabled = old


def no_grad():
    """Ops inside record no history: like torch.no_grad (a context manager)."""
    return set_grad_enabled(False)


def enable_grad():
    return set_grad_enabled(True)
