"""tc.autocast: mixed precision by op, as torch.autocast("cpu") does it.

Inside `with tc.autocast(tc.bfloat16):` the ops ops.yaml marks `autocast: lower` (matmul,
linear, conv, attention) run on bfloat16 (or float16) copies of their float32 inputs, the
ones marked `fp32` (losses, prod) on float32 copies, and every other op on its inputs as
they are, so ordinary type promotion picks the widest dtype.  The dispatcher applies the
policy (dispatcher.py); this module only keeps the thread's state.  Blocks nest: an inner
block sets its own dtype or, with `enabled=False`, turns autocast off until it ends.
tc.trace keys its compiled programs by that state (`autocast_key`).
"""
from __future__ import annotations

import contextlib

from ..core import dtypes as dt
from ..core.errors import ArgumentError, DTypeError
from .dispatcher import state

DEVICES = ("cpu", "cuda")


class autocast(contextlib.ContextDecorator):
    """`with tc.autocast(tc.bfloat16, enabled=True):` (also a decorator); bfloat16 by default.

    PyTorch's spelling `tc.autocast("cpu", dtype=...)` is accepted; the policy is the CPU one.
    `cache_enabled` is accepted and ignored: there is no cast cache (a traced step casts each
    parameter once in its graph, and eager casts are cheap next to the ops they feed).
    """

    def __init__(self, device_or_dtype=None, dtype=None, enabled: bool = True, cache_enabled: bool | None = None):
        is_device = isinstance(device_or_dtype, str) and device_or_dtype in DEVICES
        if not is_device and device_or_dtype is not None:
            if dtype is not None:
                raise ArgumentError(f"tc.autocast: the first argument is a device type ({', '.join(DEVICES)}) "
                                    f"or the dtype, got {device_or_dtype!r} and dtype={dtype!r}")
            dtype = device_or_dtype
        if not isinstance(enabled, bool):
            raise ArgumentError(f"tc.autocast: enabled must be True or False, got {enabled!r}")
        self.dtype = dt.BFLOAT16 if dtype is None else _low_dtype(dtype)
        self.enabled = enabled
        self._outer: list[dt.DType | None] = []

    def __enter__(self):
        self._outer.append(state.autocast)
        state.autocast = self.dtype if self.enabled else None
        return self

    def __exit__(self, *exc):
        state.autocast = self._outer.pop()
        return False


def _low_dtype(dtype) -> dt.DType:
    try:
        d = dt.to_dtype(dtype)
    except DTypeError:
        d = None
    if d not in dt.HALF_TYPES:
        raise DTypeError(f"tc.autocast: dtype must be tc.bfloat16 or tc.float16, got {dtype!r}")
    return d


def is_autocast_enabled() -> bool:
    return state.autocast is not None


def get_autocast_dtype() -> dt.DType | None:
    """The dtype `lower` ops run in now, or None outside autocast."""
    return state.autocast


def autocast_key() -> str | None:
    """The part of a compiled program's signature that autocast decides: its dtype's name."""
    return None if state.autocast is None else state.autocast.label
