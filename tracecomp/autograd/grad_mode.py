"""Grad mode: whether ops record autograd history (tc.no_grad / tc.enable_grad)."""
from __future__ import annotations

import contextlib

from ..dispatch.dispatcher import state


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


@contextlib.contextmanager
def differentiating():
    """While tc.grad, value_and_grad or vjp runs its function (with grad mode on): a tensor
    that requires grad is then one they track, so a tc.trace'd function called on it must
    let autograd see its ops."""
    state.differentiating += 1
    try:
        with enable_grad():
            yield
    finally:
        state.differentiating -= 1


def is_differentiating() -> bool:
    return state.differentiating > 0
