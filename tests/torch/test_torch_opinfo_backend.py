"""PyTorch's OpInfo samples through the backend: each OpInfo that tests/test_torch_opinfo.py
maps onto a tracecomp op (its OPS table, reused here) run as
`torch.compile(op, backend="tracecomp")` against eager PyTorch, values and gradients,
float32 and float64, as PyTorch's test_torchinductor_opinfo.py does for Inductor.

Strict: a node that would fall back to PyTorch fails the sample (otherwise PyTorch would be
compared with itself), and so does a graph break (fullgraph=True).  EXPECTED_FAILURES names
the OpInfos that cannot go through whole, each with its reason.  The default run takes
one sample of each OpInfo in FAST, a representative set, in one dtype; the marked-slow
sweep (TRACECOMP_SLOW=1, which conftest.py needs for slow tests) takes every OpInfo, an even
spread of SLOW_SWEEP samples per dtype.
"""
from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (a test-only dependency)")
if not hasattr(torch, "compile"):          # tests/torch/ itself, seen as a namespace package
    pytest.skip("torch not installed (a test-only dependency)", allow_module_level=True)
opinfo = pytest.importorskip("test_torch_opinfo", reason="tests/test_torch_opinfo.py (the OpInfo table) "
                             "is importable from the tests folder")

import tracecomp.torch as tt  # noqa: E402

DTYPES = ("float32", "float64")
# The slow sweep runs with TRACECOMP_SLOW=1 only (conftest.py), and then takes an even
# spread of SLOW_SWEEP per dtype; without it, float32's first sample and float64's middle
# one are listed (and left out).
SLOW_SWEEP = 4 if os.environ.get("TRACECOMP_SLOW") else None

# (OpInfo or "*", a piece of the error) -> why such a sample cannot run through the backend whole:
# the sample is an expected failure (pytest -rx lists them).  Any other error fails.
DATA_DEPENDENT = "a size that depends on the data"
EXPECTED_FAILURES = {
    ("narrow", DATA_DEPENDENT): "start held in a tensor: the result's size depends on its value",
    ("tensor_split", DATA_DEPENDENT): "split points held in a tensor: the sizes depend on their values",
    ("gather", "dtype uint8"): "a uint8 index tensor (tracecomp has no uint8)",
    ("index_put", DATA_DEPENDENT): "a bool-mask index: the values' gradient is grad[mask] (a data-dependent size)",
    ("index_fill", "aten._unique.default"): "its backward takes the unique indices (a data-dependent size)",
    ("norm.nuc", "aten._linalg_svd.default"): "the nuclear norm needs singular values (no SVD yet)",
    **{(key, ""): "a result shape that depends on the values (a graph break or an unbacked size)"
       for key in opinfo.DATA_DEPENDENT},
    ("*", "tensor creation function with requires_grad=True"):
        "a factory called with requires_grad=True: Dynamo cannot trace it (a graph break)",
}

# OpInfos whose op is wrapped in wrapper_set_seed (a context manager Dynamo cannot trace):
# the function itself is compiled (their random samples are skipped anyway).
UNWRAPPED = {"nn.functional.scaled_dot_product_attention": lambda: torch.nn.functional.scaled_dot_product_attention}

# One sample each in the default run: elementwise, reductions, matmuls, views, indexing,
# normalization, losses and layers.
FAST = ("add", "mul", "div.no_rounding_mode", "pow", "where", "exp", "tanh", "sigmoid",
        "nn.functional.gelu", "sum", "mean", "amax", "var", "softmax", "log_softmax", "logsumexp",
        "matmul", "bmm", "nn.functional.linear", "reshape", "permute", "transpose", "expand", "cat",
        "stack", "split", "gather", "index_select", "nn.functional.embedding",
        "nn.functional.layer_norm", "nn.functional.cross_entropy", "nn.functional.conv2d",
        "nn.functional.max_pool2d", "nn.functional.scaled_dot_product_attention", "cumsum", "clamp")


def _spread(n: int, k: int | None, dtype: str) -> list[int]:
    if k is None:
        return [0 if dtype == "float32" else n // 2] if n else []
    return list(range(0, n, math.ceil(n / k))) if n > k else list(range(n))


def _cases(keys, per: int | None) -> list:
    found = []
    for key in keys:
        info = opinfo.opinfos().get(key)
        if info is None:
            continue
        for dtype in DTYPES:
            if opinfo.DTYPES[dtype] in info.supported_dtypes("cpu"):
                found += [(key, dtype, i) for i in _spread(len(opinfo.samples(key, dtype)), per, dtype)]
    return found


def _ids(cases: list) -> list[str]:
    return [f"{key}-{dtype}-{i}" for key, dtype, i in cases]


def _expecting(key: str, fn):
    """fn(), or pytest.xfail with the reason where EXPECTED_FAILURES names its error."""
    try:
        return fn()
    except Exception as e:      # noqa: BLE001 - Dynamo wraps the backend's errors in its own
        for (op, piece), why in EXPECTED_FAILURES.items():
            if op in (key, "*") and piece in str(e):
                pytest.xfail(why)
        raise


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()       # each sample compiles afresh (no recompile limit, no dynamic sizes)
    yield
    torch._dynamo.reset()


def _copy(sample):
    """The sample with fresh copies of its tensors (ops may change arguments in place)."""
    return sample.transform(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                            if isinstance(t, torch.Tensor) else t)


def _numpy(outs) -> list:
    return [o.detach().numpy() if isinstance(o, torch.Tensor) else o for o in opinfo._leaves(outs)]


def _differentiable(outs) -> list:
    return [o for o in opinfo._leaves(outs) if isinstance(o, torch.Tensor) and o.dtype.is_floating_point
            and o.requires_grad]


def _grads(outs, inputs: list) -> list | None:
    """Gradients of sum(outputs * fixed cotangents) for the inputs that need them."""
    diff = _differentiable(outs)
    wrt = [t for t in inputs if t.requires_grad]
    if not diff or not wrt:
        return None
    loss = sum((o * torch.from_numpy(opinfo._cotangent(o.shape, k)).to(o.dtype)).sum() for k, o in enumerate(diff))
    got = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(got, wrt)]


def check(key: str, dtype: str, i: int) -> None:
    info, sample = opinfo.opinfos()[key], opinfo.samples(key, dtype)[i]
    if key in opinfo.RANDOM_SAMPLES and opinfo.RANDOM_SAMPLES[key](sample):
        pytest.skip(f"{key}: a random sample: its draws cannot match PyTorch's")
    eager, ours = _copy(sample), _copy(sample)
    try:
        want = opinfo._torch_result(info, eager)
    except Exception as e:      # noqa: BLE001 - a sample PyTorch itself rejects is no sample
        pytest.skip(f"{key}: PyTorch rejects this sample ({type(e).__name__})")
    before = dict(tt.counts)
    op = UNWRAPPED[key]() if key in UNWRAPPED else info.op
    compiled = torch.compile(lambda x, *a, **k: op(x, *a, **k), backend="tracecomp",
                             options={"strict": True}, fullgraph=True, dynamic=False)
    got = _expecting(key, lambda: compiled(ours.input, *ours.args, **ours.kwargs))
    tolerance = opinfo._tolerance(opinfo.TOLERANCE_FOR, key, dtype)     # entries may name some dtypes only
    if dtype == "float32" and key.startswith(opinfo.ORACLE_IN_FLOAT64):
        want_values = opinfo._torch_result_via_float64(info, _copy(sample))
    else:
        want_values = want
    opinfo._compare(_numpy(got), _numpy(want_values), dtype, tolerance, f"{key} backend", sample)
    # arguments changed in place (batch norm's running statistics) end as eager's do
    opinfo._compare(_numpy(opinfo._torch_tensors(ours)), _numpy(opinfo._torch_tensors(eager)), dtype,
                    tolerance, f"{key} backend: the arguments afterwards")
    counted = tt.counts["forward"] + tt.counts["inference"] - before.get("forward", 0) - before.get("inference", 0)
    assert counted >= 1 or not any(isinstance(o, torch.Tensor) for o in opinfo._leaves(got)), \
        f"{key}: no graph reached the backend"
    grad_tolerance = opinfo._tolerance(opinfo.GRAD_TOLERANCE_FOR, key, dtype)
    expected = _grads(want, opinfo._torch_tensors(eager))
    if expected is None:
        return
    if dtype == "float32" and key in opinfo.GRAD_ORACLE_IN_FLOAT64:
        pytest.skip(f"{key}: PyTorch's own float32 gradient is off (test_torch_opinfo.py's oracle)")
    grads = _expecting(key, lambda: _grads(got, opinfo._torch_tensors(ours)))
    opinfo._compare(_numpy(grads), _numpy(expected), dtype,
                    grad_tolerance, f"{key} backend gradient")


# each FAST OpInfo in one dtype, float32 and float64 in turn
FAST_CASES = [c for c in _cases(FAST, 1) if (FAST.index(c[0]) % 2 == 0) == (c[1] == "float32")
              or len(opinfo.opinfos()[c[0]].supported_dtypes("cpu") & {torch.float32, torch.float64}) < 2]


@pytest.mark.parametrize("key, dtype, i", FAST_CASES, ids=_ids(FAST_CASES))
def test_fast(key, dtype, i):
    check(key, dtype, i)


SWEEP_CASES = [c for c in _cases(opinfo.OPS, SLOW_SWEEP) if c not in FAST_CASES]


@pytest.mark.slow
@pytest.mark.parametrize("key, dtype, i", SWEEP_CASES, ids=_ids(SWEEP_CASES))
def test_sweep(key, dtype, i):
    check(key, dtype, i)
