"""PyTorch's own OpInfo samples (torch.testing._internal's op_db) through every tracecomp op
that has an OpInfo: eagerly, compiled with tc.trace, and the compiled gradient of
sum(outputs * fixed cotangents) against torch.autograd.grad; float32, float64, int64, and
bfloat16 and float16 (eager, compiled, and gradients where the OpInfo supports the dtype's
backward on CPU) within PyTorch's own tolerances for them (half_tolerance).

OPS maps each OpInfo (name, or name.variant) to the tracecomp call, explicitly.  A sample is
skipped only through SKIPS, which names the argument tracecomp does not support and why;
pytest -rs lists every skip with its reason.  Any other refusal or mismatch fails.  The
OpInfos run an even spread of SPREAD samples per dtype unless TRACECOMP_SLOW=1.  PyTorch is
a test-only dependency: without it this module is skipped.  Random ops (randn) are not
here: their values cannot match PyTorch's; test_ops.py checks them by distribution.
"""
from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle: "
                            "pip install torch==2.13.0)")
common = pytest.importorskip("torch.testing._internal.common_methods_invocations",
                             reason="PyTorch's OpInfo database needs expecttest (pip install expecttest)")
from torch.testing._internal import common_utils  # noqa: E402

from tables.sweeps import sweep  # noqa: E402

# OpInfo name[.variant] -> the tracecomp call: "tc.f" (function), "x.f" (method of the
# sample's input), "x.f@" (property), or a function taking the sample's (input, *args,
# **kwargs) where the OpInfo's calling convention differs from the op's signature.  Every
# entry is tested; an OpInfo absent here is not.
OPS = {
    "abs": "tc.abs", "add": "tc.add", "sub": "tc.sub", "mul": "tc.mul", "atan2": "tc.atan2",
    "div.no_rounding_mode": "tc.div", "pow": "tc.pow", "maximum": "tc.maximum", "minimum": "tc.minimum",
    "max.binary": "tc.max", "min.binary": "tc.min", "clamp": "tc.clamp",
    "where": lambda x, condition, other: tc.where(condition, x, other),    # OpInfo's order
    "eq": "tc.eq", "ne": "tc.ne", "lt": "tc.lt", "le": "tc.le", "gt": "tc.gt", "ge": "tc.ge",
    "logical_and": "tc.logical_and", "logical_or": "tc.logical_or", "logical_not": "tc.logical_not",
    "neg": "tc.neg", "sign": "tc.sign", "reciprocal": "tc.reciprocal", "square": "tc.square",
    "sqrt": "tc.sqrt", "rsqrt": "tc.rsqrt", "exp": "tc.exp", "exp2": "tc.exp2", "expm1": "tc.expm1",
    "log": "tc.log", "log2": "tc.log2", "log1p": "tc.log1p", "sin": "tc.sin", "cos": "tc.cos",
    "tan": "tc.tan", "tanh": "tc.tanh", "sigmoid": "tc.sigmoid", "erf": "tc.erf",
    "floor": "tc.floor", "ceil": "tc.ceil", "round": "tc.round", "round.decimals_0": "tc.round",
    "round.decimals_3": "tc.round", "round.decimals_neg_3": "tc.round",
    "nn.functional.relu": "tc.relu", "nn.functional.silu": "tc.silu", "nn.functional.gelu": "tc.gelu",
    "sum": "tc.sum", "mean": "tc.mean", "prod": "tc.prod", "amax": "tc.amax", "amin": "tc.amin",
    "all": "tc.all", "any": "tc.any", "argmax": "tc.argmax", "argmin": "tc.argmin",
    "max.reduction_no_dim": "tc.max", "min.reduction_no_dim": "tc.min",
    "max.reduction_with_dim": "tc.max", "min.reduction_with_dim": "tc.min",
    "var": "tc.var", "std": "tc.std", "var.unbiased": "tc.var", "std.unbiased": "tc.std", "logsumexp": "tc.logsumexp",
    "softmax": "tc.softmax", "softmax.with_dtype": "tc.softmax",
    "log_softmax": "tc.log_softmax", "log_softmax.with_dtype": "tc.log_softmax",
    "matmul": "tc.matmul", "mm": "tc.mm", "bmm": "tc.bmm",
    "nn.functional.linear": "tc.linear", "nn.functional.layer_norm": "tc.layer_norm",
    "nn.functional.mse_loss": "tc.mse_loss", "nn.functional.cross_entropy": "tc.cross_entropy",
    "reshape": "tc.reshape", "view": "x.view", "flatten": "tc.flatten", "squeeze": "tc.squeeze",
    "squeeze.multiple": "tc.squeeze", "unsqueeze": "tc.unsqueeze", "permute": "tc.permute",
    "transpose": "tc.transpose", "t": "tc.t", "mT": "x.mT@", "expand": "x.expand",
    "broadcast_to": "tc.broadcast_to", "select": "tc.select", "slice": "tc.slice",
    "split": "tc.split", "split.list_args": "tc.split", "chunk": "tc.chunk", "cat": "tc.cat",
    "stack": "tc.stack", "gather": "tc.gather", "index_select": "tc.index_select",
    "index_add": "tc.index_add", "scatter_add": "tc.scatter_add",
    "to": "x.to", "float": "x.float", "double": "x.double", "int": "x.int", "long": "x.long",
    "bool": "x.bool",
    "zeros": "tc.zeros", "ones": "tc.ones", "full": "tc.full", "zeros_like": "tc.zeros_like",
    "ones_like": "tc.ones_like", "full_like": "tc.full_like", "arange": "tc.arange",
    # issue 13, elementwise
    **{n: f"tc.{n}" for n in (
        "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "trunc", "frac", "isnan",
        "isinf", "isposinf", "isneginf", "isfinite", "nan_to_num", "deg2rad", "rad2deg", "sinc",
        "bitwise_not", "fmod", "remainder", "floor_divide", "bitwise_and", "bitwise_or", "bitwise_xor",
        "logaddexp", "logaddexp2", "hypot", "copysign", "xlogy", "clamp_min", "clamp_max", "lerp",
        "addcmul", "addcdiv")},
    # issue 13, layout
    **{n: f"tc.{n}" for n in (
        "flip", "fliplr", "flipud", "roll", "movedim", "unbind",
        "narrow", "unflatten", "atleast_1d", "atleast_2d", "atleast_3d", "hstack", "vstack", "dstack",
        "column_stack", "split_with_sizes", "tensor_split", "tile", "tril", "triu", "diagonal",
        "diag_embed", "diag")},
    **{f"nn.functional.{n}": f"tc.{n}" for n in (
        "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss",
        "smooth_l1_loss", "huber_loss", "kl_div")},
    "eye": "tc.eye", "linspace": "tc.linspace", "logspace": "tc.logspace",
    "linspace.tensor_overload": "tc.linspace", "logspace.tensor_overload": "tc.logspace",
    "tril_indices": "tc.tril_indices", "triu_indices": "tc.triu_indices",
    "cumsum": "tc.cumsum",
    "take": "tc.take", "index_fill": "tc.index_fill",
    "masked_fill": "tc.masked_fill", "take_along_dim": "tc.take_along_dim", "slice_scatter": "tc.slice_scatter",
    "select_scatter": "tc.select_scatter", "repeat_interleave": "tc.repeat_interleave",
    "meshgrid.variadic_tensors": "tc.meshgrid", "meshgrid.list_of_tensors": "tc.meshgrid",
    "nansum": "tc.nansum", "nanmean": "tc.nanmean", "count_nonzero": "tc.count_nonzero",
    "aminmax": "tc.aminmax", "var_mean": "tc.var_mean", "std_mean": "tc.std_mean",
    "var_mean.unbiased": "tc.var_mean", "std_mean.unbiased": "tc.std_mean",
    "div.trunc_rounding": "tc.div", "div.floor_rounding": "tc.div",
    **{n: f"tc.{n}" for n in ("outer", "dot", "vdot", "mv", "addmm", "addmv", "baddbmm", "kron", "cross")},
    "view_as": "x.view_as", "reshape_as": "x.reshape_as", "expand_as": "x.expand_as", "repeat": "x.repeat",
    "linalg.vector_norm": lambda x, *a, **k: tc.linalg.vector_norm(x, *a, **k),
    "linalg.matrix_norm": lambda x, *a, **k: tc.linalg.matrix_norm(x, *a, **k),
    "norm": "tc.norm", "norm.fro": "tc.norm", "norm.inf": "tc.norm", "norm.nuc": "tc.norm",
    "tensordot": lambda a, b, dims=2: tc.tensordot(a, b, *dims) if isinstance(dims, (list, tuple)) else
    tc.tensordot(a, b, dims),
    "einsum": lambda tensors, equation: tc.einsum(equation, tensors),
    "nn.functional.cosine_similarity": "tc.cosine_similarity",
    "nn.functional.pairwise_distance": "tc.pairwise_distance", "cdist": "tc.cdist",
    **{n: f"tc.{n}" for n in ("erfc", "erfinv", "lgamma", "digamma")},
    **{f"polygamma.polygamma_n_{n}": lambda x, n, **k: tc.polygamma(n, x) for n in range(5)},
    "nonzero": "tc.nonzero", "argwhere": "tc.argwhere", "masked_select": "tc.masked_select",
    "nonzero_static": "tc.nonzero_static", "unique": "tc.unique",
    "clone": "tc.clone", "addmm.decomposed": "tc.addmm",
    "scatter": "tc.scatter", "index_copy": "tc.index_copy", "index_put": "tc.index_put", "diagonal_scatter": "tc.diagonal_scatter",
    **{f"scatter_reduce.{r}": "tc.scatter_reduce" for r in ("sum", "prod", "mean", "amax", "amin")},
    "broadcast_tensors": lambda x, *others: tc.broadcast_tensors(x, *others),
    **{n: f"tc.{n}" for n in ("cumprod", "cummax", "cummin", "logcumsumexp", "sort", "argsort", "msort", "topk", "kthvalue", "median", "searchsorted",
                               "bucketize")},
    **{f"nn.functional.{n}": f"tc.{n}" for n in (
        "softplus", "leaky_relu", "elu", "selu", "celu", "hardtanh", "relu6", "hardsigmoid",
        "hardswish", "mish", "logsigmoid", "softsign", "tanhshrink", "glu")},
    # issue 12, sliding windows
    **{f"nn.functional.{n}": f"tc.nn.functional.{n}" for n in (
        "conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "unfold", "scaled_dot_product_attention")},
    # issue 12 (dropout's draws cannot match PyTorch's: tests/library/test_dropout.py)
    **{f"nn.functional.{n}": f"tc.{n}" for n in ("batch_norm", "instance_norm", "group_norm", "rms_norm", "one_hot")},
    "nn.functional.embedding": lambda weight, indices, **k: tc.embedding(indices, weight, **k),   # OpInfo's order
    # issue 12: padding, resizing, adaptive pooling
    "constant_pad_nd": "tc.constant_pad_nd",
    **{f"nn.functional.pad.{m}": "tc.pad" for m in ("constant", "reflect", "replicate", "replicate_negative",
                                                    "circular")},
    **{f"nn.functional.interpolate.{m}": "tc.interpolate" for m in (
        "nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area", "bicubic")},
    "nn.functional.upsample_nearest": lambda x, size=None, scale_factor=None: tc.interpolate(x, size, scale_factor),
    "nn.functional.upsample_bilinear": lambda x, size=None, scale_factor=None:
        tc.interpolate(x, size, scale_factor, mode="bilinear", align_corners=True),
    **{f"nn.functional.adaptive_{k}_pool{n}d": f"tc.adaptive_{k}_pool{n}d" for k in ("avg", "max") for n in (1, 2)},
}

# (OpInfo key or "*", a piece of tracecomp's error message) -> why the sample is skipped.
# Only arguments tracecomp does not support yet belong here; issue 13 adds each of them,
# and deletes its line.
SKIPS = {
    ("linalg.matrix_norm", "it needs singular values"): "ord 2, -2 and 'nuc' need singular values (no SVD yet)",
    ("norm.nuc", "it needs singular values"): "the nuclear norm needs singular values (no SVD yet)",
    ("unique", "compiles unique over all elements (dim=None) only"):
        "unique over a dim under tc.trace (its rows' count depends on the values: eager only)",
    ("nn.functional.one_hot", "pass num_classes"):
        "num_classes=-1 under tc.trace (the largest class is the result's shape: eager only)",
    ("nn.functional.interpolate.bicubic", "mode 'bicubic' is not supported"): "bicubic interpolation",
    ("tensor_split", "a 0-d tensor of sections makes the number of pieces depend on its value"):
        "a 0-d tensor of sections under tc.trace (the number of results is its value: eager only; "
        "torch.compile(fullgraph=True) refuses it too, GuardOnDataDependentSymNode)",
}

# Result shapes that depend on the values (PyTorch's unbacked sizes): compiled through
# tc.trace's staged run like any op; their gradients run eagerly, since the loss multiplies
# the results by cotangents of the example's static shapes, which a run-time size does not
# broadcast with (tests/transforms/test_unbacked_sizes.py checks their traced gradients).
DATA_DEPENDENT = ("nonzero", "argwhere", "masked_select", "unique")     # (also the backend's expected failures)
VALUE_DEPENDENT = DATA_DEPENDENT + ("tensor_split", "repeat_interleave")

SKIP_PREFIX = "not supported yet: "          # conftest.py sums up these skips
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "bfloat16": torch.bfloat16, "float16": torch.float16}
HALVES = ("bfloat16", "float16")
# (rtol, atol); the half dtypes' are torch.testing's defaults (torch.testing._comparison),
# widened per OpInfo by its own toleranceOverride decorators (half_tolerance)
TOLERANCE = {"float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10),
             "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}
# float32 gradients: PyTorch's own rounding differs from ours by a few 1e-4 where the exact
# answer is 0 (layer_norm over one element)
GRAD_TOLERANCE = {"float32": (1e-4, 5e-4), "float64": (1e-8, 1e-8),
                  "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}
# PyTorch's float64 polygamma (trigamma's series stops early) is up to 3.6e-10 away from
# mpmath on its samples; ours is within 1.1e-15 of mpmath.
TOLERANCE_FOR = {f"polygamma.polygamma_n_{n}": {**TOLERANCE, "float64": (1e-9, 1e-10)} for n in range(5)}
# scaled_dot_product_attention's float32 samples reach scores of ~100, whose rounding (an ulp
# is 7.6e-6) moves the softmax weights by that much relatively, and outputs of size 9 by up
# to 7e-5; ours are within 1.7e-5 of PyTorch's float64, PyTorch's float32 within 8e-6.
TOLERANCE_FOR["nn.functional.scaled_dot_product_attention"] = {**TOLERANCE, "float32": (1e-5, 1e-4)}
GRAD_TOLERANCE_FOR: dict = {}
# ... and its half gradients, computed in float32 by us and by the oracle (HALF_ORACLE_IN_FLOAT32),
# carry that rounding to gradients near 0: ours up to 3.9e-5 from PyTorch's float64, its float32
# up to 1.1e-5 (bf16 -16, -20; f16 -5, -8, -12, -20), over the half dtypes' atol of 1e-5
GRAD_TOLERANCE_FOR["nn.functional.scaled_dot_product_attention"] = {h: (TOLERANCE[h][0], 1e-4) for h in HALVES}
# Ops whose float32 gradients we take from PyTorch in float64, rounded: logcumsumexp's
# samples hold 1e4 beside values near 0, and PyTorch's float32 gradient, exp(x + log-sum)
# with both terms rounded at 1e4, is 3.9e-3 away from its float64 one; ours sums in float64
# (autograd/helpers.py) and is within 4e-7 of it.
GRAD_ORACLE_IN_FLOAT64 = ("logcumsumexp",)


@functools.cache
def opinfos() -> dict:
    found = {}
    for info in common.op_db:
        key = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if key in OPS:
            found[key] = info
    return found


@functools.cache
def samples(key: str, dtype: str) -> list:
    info = opinfos()[key]
    torch.manual_seed(0)
    grad = DTYPES[dtype].is_floating_point and info.supports_autograd and _grad_supported(info, dtype)
    return _sample_inputs(info, DTYPES[dtype], grad)


def _grad_supported(info, dtype: str) -> bool:
    return dtype not in HALVES or DTYPES[dtype] in info.supported_backward_dtypes("cpu")


@functools.cache
def half_tolerance(key: str, dtype: str) -> tuple[float, float]:
    """The loosest (rtol, atol) the OpInfo's own toleranceOverride decorators declare for a
    half dtype on the CPU (or any device), at least torch.testing's default for it."""
    from torch.testing._internal.common_device_type import toleranceOverride
    rtol, atol = TOLERANCE[dtype]
    for decorate in opinfos()[key].decorators:
        if getattr(decorate, "device_type", None) not in (None, "cpu"):
            continue
        for d in getattr(decorate, "decorators", ()):
            if isinstance(d, toleranceOverride) and DTYPES[dtype] in d.d:
                rtol, atol = max(rtol, d.d[DTYPES[dtype]].rtol), max(atol, d.d[DTYPES[dtype]].atol)
    return rtol, atol


def _tolerance(table: dict, key: str, dtype: str) -> dict:
    """TOLERANCE_FOR's (or GRAD_TOLERANCE_FOR's) entry for `key` with the half dtypes' from
    the OpInfo unless the entry names them."""
    given = table.get(key, {})
    base = TOLERANCE if table is TOLERANCE_FOR else GRAD_TOLERANCE
    return {**base, **{h: half_tolerance(key, h) for h in HALVES}, **given}


def _sample_inputs(info, dtype, requires_grad: bool) -> list:
    """What info.sample_inputs("cpu", ...) yields, without its search of the call stack for a
    unittest test (inspect.stack, twice per call: ~40 s of this module's import under pytest,
    which has no such test): the same seed before each sample, as its TrackedInputIter sets."""
    made = iter(info.sample_inputs_func(info, "cpu", dtype, requires_grad))
    found = []
    while True:
        common_utils.set_rng_seed(common_utils.SEED)
        sample = next(made, None)
        if sample is None:
            return found
        found.append(sample)


# Many OpInfos have dozens of samples per dtype, a few hundreds (unique, searchsorted,
# logspace, cdist, ...): the default run takes SPREAD of them, evenly spaced through the
# list so that every kind of argument stays covered; the others are marked slow
# (TRACECOMP_SLOW=1 runs them all; the last full run passed).  The layers' samples compile
# programs of several kernels each (convolution, pooling, padding, resizing), so they take
# a smaller spread.
SPREAD, LAYER_SPREAD = 8, 4
# bfloat16 and float16 repeat the float32 samples with rounded values: a smaller spread
HALF_SPREAD, HALF_LAYER_SPREAD = 2, 1
LAYERS = ("nn.functional.conv", "nn.functional.max_pool", "nn.functional.avg_pool", "nn.functional.adaptive_",
          "nn.functional.pad", "constant_pad_nd", "nn.functional.interpolate", "nn.functional.unfold",
          "nn.functional.upsample")


def _all_cases() -> tuple[list, set]:
    """Every (key, dtype, sample index) as a pytest.param, and the ids of the default spread."""
    found, spread = [], set()
    for key in OPS:
        info = opinfos().get(key)
        if info is None:
            continue
        for dtype, tdt in DTYPES.items():
            if tdt in info.supported_dtypes("cpu"):
                n, k = len(samples(key, dtype)), LAYER_SPREAD if key.startswith(LAYERS) else SPREAD
                if dtype in HALVES:
                    k = HALF_LAYER_SPREAD if key.startswith(LAYERS) else HALF_SPREAD
                spread |= {f"{key}-{dtype}-{i}" for i in range(0, n, max(1, math.ceil(n / k)))}
                found += [pytest.param(key, dtype, i, id=f"{key}-{dtype}-{i}") for i in range(n)]
    return found, spread


_ALL, _SPREAD_IDS = _all_cases()
CASES = sweep(_ALL, lambda p: p.id in _SPREAD_IDS)


def test_every_mapped_opinfo_exists():
    assert sorted(set(OPS) - set(opinfos())) == []


# ------------------------------------------------------------------ converting a sample

def _leaves(x) -> list:
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    return [x]


def _to_tc(x, tensors: list):
    """The sample's argument for tracecomp: tensors become the next of `tensors`."""
    if isinstance(x, torch.Tensor):
        return tensors.pop(0)
    if isinstance(x, torch.dtype):
        return getattr(tc, str(x).removeprefix("torch."))
    if isinstance(x, torch.Size):
        return tuple(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_tc(item, tensors) for item in x)
    if isinstance(x, dict):
        return {k: _to_tc(v, tensors) for k, v in x.items()}
    if isinstance(x, torch.device):
        return str(x)
    return x


def _torch_tensors(sample) -> list:
    return [x for x in _leaves([sample.input, list(sample.args), list(sample.kwargs.values())])
            if isinstance(x, torch.Tensor)]


def _call(key: str, tensors: list, sample):
    """Call the tracecomp op on `tensors` (tc tensors, in the sample's order)."""
    pool = list(tensors)
    first = _to_tc(sample.input, pool)
    args = _to_tc(list(sample.args), pool)
    kwargs = _to_tc(dict(sample.kwargs), pool)
    target = OPS[key]
    if callable(target):
        return target(first, *args, **kwargs)
    if target.startswith("tc."):
        return functools.reduce(getattr, target[3:].split("."), tc)(first, *args, **kwargs)
    name = target[2:]
    if name.endswith("@"):
        return getattr(first, name[:-1])
    return getattr(first, name)(*args, **kwargs)


def _numpy(t) -> np.ndarray:
    """A torch tensor's values as NumPy's (bfloat16 through ml_dtypes, which torch lacks)."""
    t = t.detach().cpu().resolve_conj()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def _arrays(sample) -> list[np.ndarray]:
    return [_numpy(t) for t in _torch_tensors(sample)]


# sort, argsort and msort leave the order of equal values unspecified unless stable=True, and
# PyTorch's CPU kernel's order among a half dtype's many ties (8000 bfloat16 values: 89% of
# the indices differ) is not the stable one; ours is, so _torch_result asks torch for it.

def _torch_result(info, sample):
    if info.name in ("sort", "argsort") and "stable" not in sample.kwargs:
        return info.op(sample.input, *sample.args, **sample.kwargs, stable=True)
    if info.name == "msort":
        return torch.sort(sample.input, dim=0, stable=True).values
    return info.op(sample.input, *sample.args, **sample.kwargs)


def _skip_reason(key: str, message: str) -> str | None:
    for (op, piece), why in SKIPS.items():
        if op in (key, "*") and piece in message:
            return why
    return None


def _run_or_skip(key: str, fn):
    try:
        return fn()
    except tc.TracecompError as e:
        why = _skip_reason(key, str(e))
        if why is None:
            raise
        pytest.skip(f"{SKIP_PREFIX}{why}")


# ------------------------------------------------------------------ comparing results

# Ops whose index output PyTorch leaves unspecified among equal values (a selection
# algorithm, not a stable sort): an index there passes when it picks an equal value.
TIES_ANY_INDEX = ("topk", "kthvalue")


def _tie_dim(sample) -> int:
    """The dim topk and kthvalue select along (their second argument)."""
    return sample.args[1] if len(sample.args) > 1 else sample.kwargs.get("dim", -1)


def _picks_equal_values(sample, got: np.ndarray, want: np.ndarray) -> bool:
    """Whether indices `got` and `want` along the sample's dim pick equal input values."""
    x = _numpy(sample.input)
    if x.ndim == 0:
        return False
    dim = _tie_dim(sample)
    if got.ndim < x.ndim:                  # keepdim=False
        got, want = np.expand_dims(got, dim), np.expand_dims(want, dim)
    return np.array_equal(np.take_along_axis(x, got, dim), np.take_along_axis(x, want, dim))


def _ties_sorted(sample, grad) -> np.ndarray:
    """The input's gradient of a TIES_ANY_INDEX op with the values at each group of equal
    inputs (along the sample's dim) sorted: the op's index output picks among equal values
    as it likes, and so does its gradient, which lands where the index points (bfloat16's
    ties: PyTorch's selection gives the top-3 of two equal values the other order, so their
    cotangents trade places).  Each group must still get the same values."""
    x = _numpy(sample.input).astype(np.float64)        # exact: no ties made
    grad = _numpy(grad) if isinstance(grad, torch.Tensor) else grad.numpy()
    if x.ndim == 0:
        return grad
    dim = _tie_dim(sample)
    xs, gs = np.moveaxis(x, dim, -1), np.moveaxis(grad, dim, -1)
    order = np.lexsort((gs.astype(np.float64), xs), axis=-1)       # by input value, then gradient
    return np.moveaxis(np.take_along_axis(gs, order, -1), -1, dim)


def _compare(got, want, dtype: str, tolerance: dict, what: str, sample=None) -> None:
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    assert len(got_leaves) == len(want_leaves), f"{what}: {len(got_leaves)} outputs, torch gives {len(want_leaves)}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        w = _numpy(w) if isinstance(w, torch.Tensor) else np.asarray(w)
        g = g.numpy() if isinstance(g, tc.Tensor) else np.asarray(g)
        assert g.shape == w.shape, f"{what} output {i}: shape {g.shape}, torch gives {w.shape}"
        assert g.dtype == w.dtype, f"{what} output {i}: dtype {g.dtype}, torch gives {w.dtype}"
        if w.dtype.kind in "fc" or str(w.dtype) in HALVES:
            rtol, atol = tolerance.get(str(w.dtype), tolerance["float32"])
            if str(w.dtype) in HALVES:          # compared by value (exactly widened)
                g, w = g.astype(np.float32), w.astype(np.float32)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{what} output {i}")
        elif not (sample is not None and what.split()[0] in TIES_ANY_INDEX and i == 1
                  and _picks_equal_values(sample, g, w)):
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {i}")


def _cotangent(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape)


# ------------------------------------------------------------------ the tests

# Ops whose float32 results we take from PyTorch in float64, rounded: PyTorch's float32
# kernels for them compute in float32 and miss by more than the tolerance (trigamma near
# its poles: 2e-5 relative), where ours compute in float64 and agree with its float64.
ORACLE_IN_FLOAT64 = ("digamma", "polygamma.")


def _torch_result_via_float64(info, sample):
    wide = sample.transform(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t)
    out = _torch_result(info, wide)
    narrow = [o.float() if isinstance(o, torch.Tensor) and o.dtype == torch.float64 else o for o in _leaves(out)]
    return narrow[0] if isinstance(out, torch.Tensor) else narrow


# Ops whose bfloat16/float16 results (and gradients) we take from PyTorch run in float32 on
# the half inputs and rounded once: PyTorch's CPU kernels for them round intermediates in the
# half dtype (or keep half statistics) and land further from the float64 truth than ours,
# which compute in float32 and round once.  Max relative error against torch in float64 on
# the same inputs, measured on the samples that failed (ours = torch in float32, rounded):
#   log_softmax (-4): torch 0.997 bf16 / 0.968 f16 (an exact 0 where the truth is -3.8e-3),
#     ours 3.7e-3 / 4.2e-4; its gradient torch 0.383 / 8.49, ours 3.7e-3 / 1.2e-3
#   batch_norm (-0): torch 0.099 / 9.2e-3, ours 3.6e-3 / 4.2e-4; gradient torch 1.2 / 6.9e-3
#   instance_norm: torch up to 4.56 / 0.046, ours 3.5e-3 / 4.5e-4; gradient torch 0.67 / 0.15
#   group_norm, layer_norm gradients: torch 0.133 / 258 (bf16), ours 2.1e-3 / 3.7e-3 (layer_norm's
#     oracle is in float64: HALF_ORACLE_IN_FLOAT64)
#   cosine_similarity: torch 0.034 / 2.4e-3, ours 2.5e-3 / 2.8e-4; gradient torch 0.027 / 0.013
#   binary_cross_entropy_with_logits (-13): torch 0.39 / 9.9e-3, ours 3.6e-3 / 4.2e-4
#   binary_cross_entropy, kl_div, cross_entropy gradients: torch 0.996 / 0.19, ours 2.6e-3 / 3.8e-4
#   interpolate linear / trilinear: torch 0.168 / 3.18 (bf16), ours 2.4e-3 / 3.8e-3
#   interpolate area on 3 spatial dims (-14 to -21; adaptive_avg_pool3d sums in the half
#     dtype): torch 2.98 bf16 / 0.198 f16, ours 3.9e-3 / 4.9e-4 (the float64 truth rounded)
#   mse_loss (f16 -3): torch 1.1e-3, ours 2.6e-4
#   scaled_dot_product_attention (-13): torch 0.039 / 4.2e-3, ours 3.7e-3 / 4.7e-4; the
#     gradients' truths hold near-zeros: torch 115 / 22.9, ours 0.40 as torch in float32
#   softmax, logsumexp, std_mean, var_mean, vector_norm gradients: torch up to 7.6, ours 5.2e-3
#   conv2d's input gradient (f16 -15): torch 0.020, ours 4.4e-4
#   conv_transpose2d (f16 -6): torch 7.3e-3, ours 4.1e-4
#   pow's gradient (f16 -5): torch inf (an intermediate overflows float16) where the truth is 3.99e4
#   prod's gradient (f16 -20): torch 2.2e-3, ours 5.8e-4; erfinv's (f16): torch 2.0e-3, ours 4.7e-4
#   logcumsumexp's gradient (-0): torch 0.839, ours 3.6e-3 / 4.5e-4
#   erf, atan, atan2, fmod, logaddexp gradients: torch up to 0.029 (erf bf16) / 0.69 (logaddexp
#     f16), ours 3.7e-3 / 2.9e-3
#   kron's gradient (sums over the other factor in the half dtype): torch 0.51 / 0.041, ours 3.8e-3 / 4.4e-4
#   asin, atanh, softsign, sinc, rsqrt gradients: torch up to 0.134 (sinc f16), ours 3.7e-3 (asin
#     bf16) to 9.6e-3 (rsqrt bf16: from its rounded result, as torch's formula uses)
#   gradients of broadcasting ops, whose sums over the broadcast dims add half products
#     (bf16 / f16; ours = torch in float32, rounded): mul torch 0.78 / 0.038, ours 3.6e-3 / 4.7e-4;
#     div 10.5 (bf16 -6) / 0.05, ours 3.7e-3 / 4.8e-4; addcmul 0.077 / 0.027 and addcdiv 0.067 /
#     4.7e-3, ours 3.7e-3 / 4.6e-4; lerp 0.72 / 0.12, ours 3.9e-3 / 4.6e-4; xlogy 0.31 / 0.053,
#     ours 3.8e-3 / 4.5e-4; remainder 0.077 / 0.015, ours 3.9e-3 / 4.7e-4
#   f16 gradients: norm torch 1.8e-3, ours 7.2e-4; nll_loss (-34) 2.2e-3, ours 2.4e-4;
#     huber_loss (-7) 1.2e-3, ours 4.8e-4
#   f16 gradients of unfold (-87 and others, overlapping windows summed) torch 1.0e-3, ours 4.9e-4;
#     conv1d (-2 to -9) torch 0.049, ours 4.4e-4
#   polygamma n=0's bf16 gradient (-4, -9): torch 18.3, ours 3.2e-3
#   cumprod's gradient (reverse sums of half products; bf16 -8, f16 -6): torch 0.025 / 8.5e-3,
#     ours 3.5e-3 / 4.4e-4 (-9 asks for dtype=bfloat16: the oracle's dtype= is widened too)
#   einsum's gradient (-4): torch 0.113 / 0.023, ours 2.6e-3 / 3.4e-4 (-10, '...ik,...j->ij': ours
#     was torch's 2.7e-2 until contraction.py summed a lone letter of half operands in float32)
#   scatter_reduce.prod's f16 gradient (-16): torch 7.7e-4, ours 3.4e-4 (1.01e-3 apart)
#   pad's f16 gradients, copies summed in the half dtype: reflect (-9) torch 1.1e-3, ours 4.8e-4;
#     replicate (-8) 8.0e-4, ours 4.8e-4; replicate_negative (-2) 1.2e-3, ours 4.8e-4
#   add with alpha (f16 -10, alpha -3.125): torch rounds alpha * other to float16 before adding,
#     7.3e-4 from the truth 0.950439 (a tie), ours 2.4e-4 (2 ulps apart)
HALF_ORACLE_IN_FLOAT32 = (
    "log_softmax", "softmax", "logsumexp", "std_mean", "var_mean", "linalg.vector_norm",
    "nn.functional.batch_norm", "nn.functional.instance_norm", "nn.functional.group_norm",
    "nn.functional.cosine_similarity", "nn.functional.binary_cross_entropy",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.kl_div", "nn.functional.cross_entropy",
    "nn.functional.interpolate.linear", "nn.functional.interpolate.trilinear", "nn.functional.interpolate.area",
    "nn.functional.mse_loss",
    "nn.functional.scaled_dot_product_attention", "nn.functional.conv2d", "asin", "atanh",
    "nn.functional.softsign", "sinc", "rsqrt", "std_mean.unbiased", "var_mean.unbiased",
    "nn.functional.conv_transpose2d", "pow", "prod", "erfinv", "logcumsumexp", "erf", "atan", "atan2",
    "fmod", "logaddexp", "kron", "mul", "div.no_rounding_mode", "addcmul", "addcdiv", "lerp", "xlogy",
    "remainder", "norm", "nn.functional.nll_loss", "nn.functional.huber_loss",
    "nn.functional.unfold", "nn.functional.conv1d", "polygamma.polygamma_n_0", "cumprod", "einsum",
    "scatter_reduce.prod", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
    "nn.functional.pad.replicate_negative", "add")


# Ops whose half results and gradients we take from PyTorch in float64, rounded once, where its
# float32 kernel misses too: layer_norm over one element, whose centered value is exactly 0,
# gets -1.5e-5 for it in PyTorch's float32 kernel (x * rstd - mean * rstd as one fused
# multiply-add keeps the rounding error of mean * rstd, rstd = 316): the weight's whole bf16
# gradient (-2; torch in float64 2.8e-14, ours 0).  Its half kernel misses elsewhere (above).
HALF_ORACLE_IN_FLOAT64 = ("nn.functional.layer_norm",)


def _half_oracle_dtype(key: str):
    """The dtype PyTorch computes a half sample's expected values in (None: the half dtype)."""
    if key in HALF_ORACLE_IN_FLOAT64:
        return torch.float64
    return torch.float32 if key in HALF_ORACLE_IN_FLOAT32 else None


def _widen_half(sample, to):
    """The sample with its half tensors, and a half dtype= it asks for, in `to`."""
    def wide(t):
        if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16):
            return t.detach().to(to).requires_grad_(t.requires_grad)
        if isinstance(t, torch.dtype) and t in (torch.bfloat16, torch.float16):
            return to
        return t
    return sample.transform(wide)


def _torch_result_widened(info, sample, half, wide):
    out = _torch_result(info, _widen_half(sample, wide))
    narrow = [o.to(half) if isinstance(o, torch.Tensor) and o.dtype == wide else o for o in _leaves(out)]
    return narrow[0] if isinstance(out, torch.Tensor) else narrow


def _torch_grad_widened(info, sample, wrt: list[int], cotangents: list, half, wide) -> list:
    """test_grad's expected gradients of a half sample: PyTorch's in `wide` (the half inputs
    and cotangents widened exactly), rounded once."""
    sample = _widen_half(sample, wide)
    inputs = _torch_tensors(sample)
    outs = [o for o in _leaves(_torch_result(info, sample)) if isinstance(o, torch.Tensor)
            and o.dtype.is_floating_point and o.requires_grad]
    loss = sum((o * torch.from_numpy(c).to(half).to(wide)).sum() for o, c in zip(outs, cotangents))
    grads = torch.autograd.grad(loss, [inputs[k] for k in wrt], allow_unused=True)
    return [(torch.zeros_like(inputs[k]) if g is None else g).to(half) for g, k in zip(grads, wrt)]


def _torch_grad_via_float64(info, sample, wrt: list[int], cotangents: list) -> list:
    """test_grad's expected gradients of a float32 sample, computed by PyTorch in float64
    (with the float32-rounded cotangents) and rounded to float32."""
    def wide(t):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            return t.detach().double().requires_grad_(t.requires_grad)
        return t
    sample = sample.transform(wide)
    inputs = _torch_tensors(sample)
    outs = [o for o in _leaves(_torch_result(info, sample)) if isinstance(o, torch.Tensor)
            and o.dtype.is_floating_point and o.requires_grad]
    loss = sum((o * torch.from_numpy(c.astype(np.float32).astype(np.float64))).sum()
               for o, c in zip(outs, cotangents))
    grads = torch.autograd.grad(loss, [inputs[k] for k in wrt], allow_unused=True)
    return [(torch.zeros_like(inputs[k]) if g is None else g).float() for g, k in zip(grads, wrt)]


# Samples that draw random numbers (tracecomp's generator cannot reproduce PyTorch's draws);
# tests/library/test_dropout.py checks those paths against the same program with the same seed.
RANDOM_SAMPLES = {"nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0}


def _case(key, dtype, i):
    info, sample = opinfos()[key], samples(key, dtype)[i]
    if key in RANDOM_SAMPLES and RANDOM_SAMPLES[key](sample):
        pytest.skip(f"{key}: a random sample (dropout_p > 0): its draws cannot match PyTorch's")
    oracle = _torch_result_via_float64 if dtype == "float32" and key.startswith(ORACLE_IN_FLOAT64) else _torch_result
    if dtype in HALVES and _half_oracle_dtype(key):
        oracle = functools.partial(_torch_result_widened, half=DTYPES[dtype], wide=_half_oracle_dtype(key))
    try:
        want = oracle(info, sample)
    except Exception as e:      # noqa: BLE001 - a sample PyTorch itself rejects is no sample
        pytest.skip(f"{key}: PyTorch rejects this sample ({type(e).__name__})")
    return info, sample, want


@pytest.mark.parametrize("key, dtype, i", CASES)
def test_eager(key, dtype, i):
    info, sample, want = _case(key, dtype, i)
    tensors = [tc.tensor(a) for a in _arrays(sample)]
    got = _run_or_skip(key, lambda: _call(key, tensors, sample))
    _compare(got, want, dtype, _tolerance(TOLERANCE_FOR, key, dtype), f"{key} eager", sample)


@pytest.mark.parametrize("key, dtype, i", CASES)
def test_compiled(key, dtype, i):
    info, sample, want = _case(key, dtype, i)
    compiled = tc.trace(lambda *tensors: _call(key, list(tensors), sample))
    got = _run_or_skip(key, lambda: compiled(*_arrays(sample)))
    _compare(got, want, dtype, _tolerance(TOLERANCE_FOR, key, dtype), f"{key} compiled", sample)


GRAD_CASES = [c for c in CASES if c.values[1] != "int64" and opinfos()[c.values[0]].supports_autograd
              and _grad_supported(opinfos()[c.values[0]], c.values[1])]


@pytest.mark.parametrize("key, dtype, i", GRAD_CASES)
def test_grad(key, dtype, i):
    before = _arrays(samples(key, dtype)[i])       # PyTorch's call below may change some in place
    info, sample, want = _case(key, dtype, i)
    inputs = _torch_tensors(sample)
    wrt = [k for k, t in enumerate(inputs) if t.requires_grad and t.dtype.is_floating_point]
    outs = [o for o in _leaves(want) if isinstance(o, torch.Tensor) and o.dtype.is_floating_point
            and o.requires_grad]
    if not wrt or not outs:
        pytest.skip(f"{key}: nothing differentiable in this sample")
    cotangents = [_cotangent(o.shape, k) for k, o in enumerate(outs)]
    loss = sum((o * torch.from_numpy(c).to(o.dtype)).sum() for o, c in zip(outs, cotangents))
    expected = torch.autograd.grad(loss, [inputs[k] for k in wrt], allow_unused=True)
    expected = [torch.zeros_like(inputs[k]) if g is None else g for g, k in zip(expected, wrt)]
    if dtype == "float32" and key in GRAD_ORACLE_IN_FLOAT64:
        expected = _torch_grad_via_float64(info, sample, wrt, cotangents)
    if dtype in HALVES and _half_oracle_dtype(key):
        expected = _torch_grad_widened(info, sample, wrt, cotangents, DTYPES[dtype], _half_oracle_dtype(key))

    def tc_loss(*tensors):
        result = _leaves(_call(key, list(tensors), sample))
        floats = [o for o in result if o.dtype.is_floating_point]
        return sum((o * tc.tensor(c.astype(o.dtype.np)) if o.ndim else o * float(c)).sum()
                   for o, c in zip(floats, cotangents))

    arguments = [tc.tensor(a) for a in before]
    if key in UPDATES_IN_PLACE:
        # the tensors not differentiated (the running statistics) closed over, as a module's
        # buffers are, and checked afterwards as PyTorch left them
        def differentiated(*tensors):
            return tc_loss(*[tensors[wrt.index(k)] if k in wrt else t for k, t in enumerate(arguments)])
        grad, given = tc.grad(differentiated, argnums=tuple(range(len(wrt)))), [arguments[k] for k in wrt]
    else:
        grad, given = tc.grad(tc_loss, argnums=tuple(wrt)), arguments
    if key not in VALUE_DEPENDENT:
        grad = tc.trace(grad)
    got, expected = list(_run_or_skip(key, lambda: grad(*given))), list(expected)
    if key in TIES_ANY_INDEX and wrt == [0]:
        got[0], expected[0] = _ties_sorted(sample, got[0]), _ties_sorted(sample, expected[0])
    _compare(got, expected, dtype, _tolerance(GRAD_TOLERANCE_FOR, key, dtype), f"{key} gradient")
    if key in UPDATES_IN_PLACE:
        _compare_changed_in_place(arguments, before, sample, dtype, f"{key} gradient")


# Ops that change arguments in place (their running statistics): test_grad closes over
# those and checks them after the traced gradient.  At da572a2 tc.trace(tc.grad(...)) left
# closed-over running statistics holding traced values (a TraceError at the next read).
UPDATES_IN_PLACE = ("nn.functional.batch_norm", "nn.functional.instance_norm")


def _compare_changed_in_place(ours: list, before: list, sample, dtype: str, what: str) -> None:
    """Each argument that PyTorch's call changed in place holds, after ours, what PyTorch's does."""
    for k, (old, new) in enumerate(zip(before, _arrays(sample))):
        if not np.array_equal(old, new, equal_nan=True):
            _compare([ours[k]], [new], dtype, TOLERANCE, f"{what}: argument {k} changed in place")
