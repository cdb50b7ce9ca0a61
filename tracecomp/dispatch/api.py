"""The op namespace: every function generated from ops.yaml, and the few names beside them
that programs over ops use (`tensor`, the dtypes).

bindings.install fills it when tracecomp is imported; the package root re-exports what it
holds.  The library, autograd, nn and optim call ops through it (`from ..dispatch import
api as tc`) instead of importing the package root, which imports them.
"""
from __future__ import annotations

from ..core.dtypes import BOOL as bool, FLOAT32 as float32, FLOAT64 as float64, INT32 as int32, INT64 as int64
from ..tensors.factories import tensor
from ..tensors.tensor import Tensor

__all__ = ["Tensor", "bool", "float32", "float64", "int32", "int64", "tensor"]   # and, once filled, every op
