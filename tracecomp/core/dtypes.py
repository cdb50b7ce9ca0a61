"""The seven dtypes and PyTorch's type-promotion lattice.

Categories order bool < integer < floating.  Promotion follows PyTorch: within one
category the wider type wins (bfloat16 and float16 are both below float32 and neither
holds the other, so together they give float32); Python scalars ("weak" operands) and
0-d tensors only move the result to a higher category, never widen it inside one
(combine_categories).  bfloat16 and float16 are storage types: arithmetic on them
computes in float32 (their `compute` type, PyTorch's opmath type) and rounds once, to
nearest even, on the way back.  NumPy holds bfloat16 as `ml_dtypes.bfloat16`.
"""
from __future__ import annotations

import enum
import math

import ml_dtypes
import numpy as np

from .errors import DTypeError
from .halfs import round_float32, widen
from .symbolic import Dim


class DType(enum.Enum):
    bool = ("bool", np.bool_, "i1", 0, 1)
    int32 = ("int32", np.int32, "i32", 1, 4)
    int64 = ("int64", np.int64, "i64", 1, 8)
    float32 = ("float32", np.float32, "f32", 2, 4)
    float64 = ("float64", np.float64, "f64", 2, 8)
    bfloat16 = ("bfloat16", ml_dtypes.bfloat16, "bf16", 2, 2)
    float16 = ("float16", np.float16, "f16", 2, 2)

    def __init__(self, label, np_type, mlir, category, itemsize):
        self.label = label
        self.np = np.dtype(np_type)
        self.mlir = mlir
        self.category = category
        self.itemsize = itemsize

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype, so NumPy takes a tracecomp dtype wherever it takes one:
        `np.dtype(tc.float32)`, `np.zeros(3, tc.int64)` (and libraries built on it, Dask)."""
        return self.np

    @property
    def is_floating_point(self) -> bool:
        return self.category == 2

    @property
    def is_integer(self) -> bool:
        return self.category == 1

    @property
    def is_half(self) -> bool:
        """bfloat16 or float16: stored in 2 bytes, computed in float32."""
        return self.itemsize == 2

    @property
    def compute(self) -> "DType":
        """The dtype arithmetic on this one runs in (PyTorch's opmath type)."""
        return DType.float32 if self.itemsize == 2 else self

    def __repr__(self) -> str:
        return f"tracecomp.{self.label}"

    __str__ = __repr__


BOOL, INT32, INT64, FLOAT32, FLOAT64 = DType.bool, DType.int32, DType.int64, DType.float32, DType.float64
BFLOAT16, FLOAT16 = DType.bfloat16, DType.float16
HALF_TYPES = (BFLOAT16, FLOAT16)
DEFAULT_FLOAT = FLOAT32
DEFAULT_INT = INT64
_BY_NUMPY = {d.np: d for d in DType}
_BY_MLIR = {d.mlir: d for d in DType}
_ALIASES = {"half": FLOAT16, "float": FLOAT32, "double": FLOAT64, "long": INT64, "int": INT32}
# bool < i32 < i64 < {bf16, f16} < f32 < f64; the two half types share a rank
_RANK = {BOOL: 0, INT32: 1, INT64: 2, BFLOAT16: 3, FLOAT16: 3, FLOAT32: 4, FLOAT64: 5}
NAMES = ", ".join(DType.__members__)


def is_float_array_dtype(np_dtype) -> bool:
    """A NumPy dtype of floats, ml_dtypes' bfloat16 included (its kind is 'V', not 'f')."""
    d = np.dtype(np_dtype)
    return d.kind == "f" or d == BFLOAT16.np


def from_numpy(np_dtype) -> DType:
    """The DType for a NumPy dtype: smaller ints widen to one that holds every value
    (uint8 -> int32, uint32 -> int64); uint64, complex and other small floats are
    refused.  uint64 is refused as a type rather than checked value by value: its values
    past 2^63 have no int64, and a per-call scan would cost what a compiled call costs."""
    dt = np.dtype(np_dtype)
    if dt in _BY_NUMPY:
        return _BY_NUMPY[dt]
    if dt.kind in "iu" and dt.itemsize <= 4:
        return INT32 if dt.itemsize < 4 or dt.kind == "i" else INT64
    if dt.kind == "u":
        raise DTypeError(f"unsupported dtype {dt}: its values past 2^63 do not fit int64, tracecomp's "
                         "widest integer (convert with .astype(np.int64) if yours are smaller)")
    raise DTypeError(f"unsupported dtype {dt}: tracecomp has {NAMES}")


def from_mlir(name: str) -> DType:
    try:
        return _BY_MLIR[name]
    except KeyError:
        raise DTypeError(f"unknown element type '{name}' (expected one of {', '.join(_BY_MLIR)})") from None


def to_dtype(x) -> DType:
    """Accept a DType, a NumPy dtype/type, a name like 'float32', or a torch.dtype (by its
    name, so that code written for PyTorch runs unchanged; torch is never imported)."""
    if isinstance(x, DType):
        return x
    if type(x).__module__ == "torch" and type(x).__name__ == "dtype":
        x = str(x).removeprefix("torch.")
    if isinstance(x, str):
        if x in DType.__members__:
            return DType[x]
        if x in _ALIASES:
            return _ALIASES[x]
        raise DTypeError(f"unsupported dtype '{x}': tracecomp has {NAMES}")
    if x is float:
        return DEFAULT_FLOAT
    if x is int:
        return DEFAULT_INT
    if x is bool:
        return BOOL
    try:
        np_dtype = np.dtype(x)
    except (TypeError, ValueError):          # ValueError: an object whose .dtype is ours
        raise DTypeError(f"not a dtype: {type(x).__name__} {x!r}") from None
    if np_dtype not in _BY_NUMPY:     # an explicit request for a dtype we lack is refused
        raise DTypeError(f"unsupported dtype '{np_dtype}': tracecomp has {NAMES}")
    return _BY_NUMPY[np_dtype]


def cast_array(a: np.ndarray, to: np.dtype) -> np.ndarray:
    """`a.astype(to)`, with tracecomp's rule for float -> integer casts (the compiled code's
    too, llvm.scalar.cast): truncate toward zero; NaN, infinities and values out of the
    integer's range give its minimum (INT_MIN), as x86's conversion instructions and so
    PyTorch on x86 do.  NumPy alone leaves these to the platform."""
    a, to = np.asarray(a), np.dtype(to)
    if a.dtype.itemsize == 2 and is_float_array_dtype(a.dtype):
        a = widen(a)            # exact; ml_dtypes' own integer casts wrap
    if to.itemsize == 2 and is_float_array_dtype(to):     # via float32, as PyTorch rounds (twice
        return round_float32(a.astype(np.float32), to)      # from float64) and our compiled code
    if a.dtype.kind != "f" or to.kind not in "iu":
        return a.astype(to)
    low, high = float(np.iinfo(to).min), -float(np.iinfo(to).min)   # -2^(w-1), 2^(w-1): exact
    valid = (a >= low) & (a < high)
    return np.where(valid, np.where(valid, a, 0).astype(to), np.iinfo(to).min).astype(to, copy=False)


def finite_max(t: DType) -> float:
    """The largest finite value of floating dtype `t` (ml_dtypes' finfo knows bfloat16)."""
    return float(ml_dtypes.finfo(t.np).max)


def lowest(t: DType):
    """The smallest value of `t` (-inf for floats): max's identity."""
    return -math.inf if t.is_floating_point else (False if t is BOOL else int(np.iinfo(t.np).min))


def highest(t: DType):
    """The largest value of `t` (inf for floats): min's identity."""
    return math.inf if t.is_floating_point else (True if t is BOOL else int(np.iinfo(t.np).max))


def promote_types(a: DType, b: DType) -> DType:
    """Smallest dtype both convert to: the higher of the two in bool < i32 < i64 < {bf16,
    f16} < f32 < f64; bfloat16 with float16 is float32 (neither holds the other's values)."""
    if a is not b and _RANK[a] == _RANK[b]:
        return FLOAT32
    return a if _RANK[a] >= _RANK[b] else b


def scalar_dtype(value) -> DType:
    """The dtype a Python scalar takes when it becomes a tensor on its own."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (int, np.integer, Dim)):       # a symbolic size is an int
        return DEFAULT_INT
    if isinstance(value, (float, np.floating)):
        return DEFAULT_FLOAT
    raise DTypeError(f"not a scalar: {value!r}")


def _combine_categories(higher: DType | None, lower: DType | None) -> DType | None:
    if higher is None:
        return lower
    if lower is None or higher.is_floating_point:
        return higher
    if higher is BOOL or lower.is_floating_point:
        return promote_types(higher, lower)
    return higher


def result_type(dimensioned: list[DType], zero_dim: list[DType], scalars: list[DType]) -> DType:
    """PyTorch's result_type over three tiers: tensors with dims, 0-d tensors, Python scalars."""
    def fold(ds):
        out = None
        for d in ds:
            out = d if out is None else promote_types(out, d)
        return out
    out = _combine_categories(fold(dimensioned), _combine_categories(fold(zero_dim), fold(scalars)))
    if out is None:
        raise DTypeError("cannot infer a dtype: no tensor or scalar operands")
    return out
