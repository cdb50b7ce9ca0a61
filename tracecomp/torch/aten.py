"""The table from ATen overloads to tracecomp ops: what each node of an ATen FX graph runs.

Most rules are generated from ops.yaml, not written per op.  An entry's name (or its
`torch: ops.aten.<name>` key) is the ATen operator of the same name; every overload of that
operator whose arguments the entry's `func:` schema names (ATen's schemas and ops.yaml's
use PyTorch's argument names) becomes a rule that calls `tc.<name>` with the node's
arguments by name.  An ATen argument that the entry lacks (`layout`, `pin_memory`,
`implicit`, an `out=` buffer...) must hold its default or a value that changes nothing
(a strided layout, a CPU device); otherwise that node is not compiled and PyTorch runs it.

The hand-written rules below cover the ATen-specific ops that AOTAutograd's graphs are
made of and ops.yaml has no entry of the same name for: views (`view`, `_unsafe_view`),
ops with extra outputs for their backward (`native_layer_norm`, the batch-norm family,
`max_pool2d_with_indices`, `native_dropout`), the backward ops (`convolution_backward` as
the VJP of tracecomp's convolution, `max_pool2d_with_indices_backward` as a scatter-add of
the gradient at the saved indices, ...) and argument orders of their own (`embedding`
takes the weight first).  A hand-written rule replaces a generated one of the same name.

`RULES` maps `"aten.<name>.<overload>"` to a `Rule`; `rule_for(target)` finds the rule of
an FX node's target, and `Rule.refusal(args, kwargs)` says why a call cannot be compiled
(None when it can) before anything is traced.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..autograd.functional import vjp
from ..dispatch import api as tc
from ..ops.table import OpDef, default_table

# ATen arguments that tracecomp's schemas leave out because the values that reach a CPU
# backend do not change the result: name -> whether a value is one of those.
NEUTRAL = {
    "layout": lambda v: v is None or v == torch.strided,
    "pin_memory": lambda v: not v,
    "device": lambda v: v is None or torch.device(v).type == "cpu",
    "non_blocking": lambda v: True,
    "memory_format": lambda v: v is None or v in (torch.contiguous_format, torch.preserve_format),
    "implicit": lambda v: True,           # expand's flag for broadcasting it inserted itself
    "sparse_grad": lambda v: not v,
    "generator": lambda v: v is None,
    "requires_grad": lambda v: not v,
}


@dataclass(frozen=True)
class Rule:
    """How one ATen overload runs on tracecomp tensors.

    `convert(**arguments)` takes the node's arguments by their ATen names (defaults filled
    in; tensors are tc.Tensors) and returns a tc.Tensor, or a tuple for a multi-output op.
    `check(arguments)` sees the same arguments before tracing, with each tensor given as
    its example value (a torch FakeTensor: shape, dtype), and returns why the call cannot
    be compiled, or None.  `op` names what it runs (for reports), `origin` where the rule
    comes from: "ops.yaml:LINE" (generated) or "aten.py" (hand-written)."""
    overload: torch._ops.OpOverload
    op: str
    convert: Callable[..., Any]
    origin: str
    check: Callable[[dict], str | None] | None = None

    @property
    def name(self) -> str:
        return aten_name(self.overload)

    def arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        return bind(self.overload, args, kwargs)

    def refusal(self, args: tuple, kwargs: dict) -> str | None:
        """Why a call with these arguments (example values for tensors) cannot be
        compiled, or None."""
        try:
            named = self.arguments(args, kwargs)
        except TypeError as e:
            return str(e)
        return self.check(named) if self.check is not None else None

    def __call__(self, args: tuple, kwargs: dict):
        return self.convert(**self.arguments(args, kwargs))


def aten_name(overload) -> str:
    """`aten.add.Tensor` for torch.ops.aten.add.Tensor."""
    packet, name = overload._schema.name.split("::")
    return f"{packet}.{name}.{overload._overloadname}"


def bind(overload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by ATen name, with the schema's defaults filled in."""
    schema = overload._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise TypeError(f"{aten_name(overload)} takes {len(positional)} positional arguments, got {len(args)}")
    named = {a.name: v for a, v in zip(positional, args)}
    named.update(kwargs)
    for a in schema.arguments:
        if a.name not in named:
            if not a.has_default_value():
                raise TypeError(f"{aten_name(overload)}: missing argument '{a.name}'")
            named[a.name] = a.default_value
    return named


# ------------------------------------------------------------------ generated from ops.yaml
def _category(type_text: str) -> str:
    """An ATen argument type, coarsely: "tensor", "tensors" or "value"."""
    t = type_text.replace("Optional[", "").replace("]", "")
    if t.startswith("List[") and "Tensor" in t:
        return "tensors"
    return "tensor" if t == "Tensor" else "value"


def _tc_category(op: OpDef, arg) -> set[str]:
    if arg.type.is_tensor_list:
        return {"tensors"}
    if arg.type.is_tensor:
        return {"tensor", "value"} if op.kind == "elementwise" else {"tensor"}   # weak scalars
    return {"value"}


def _returns_match(overload, op: OpDef) -> bool:
    aten = [_category(str(r.type)) for r in overload._schema.returns]
    ours = ["tensors" if r.type.is_tensor_list else "tensor" if r.type.is_tensor else "value"
            for r in op.schema.returns]
    return aten == ours


def _covers(overload, op: OpDef) -> tuple[bool, list[str]]:
    """Whether `op` can take this ATen overload's calls: every tensor argument has a
    tracecomp argument of the same name and kind; the ATen arguments it lacks are
    returned (their values are checked per call)."""
    ours = {a.name: a for a in op.schema.arguments}
    missing = []
    for a in overload._schema.arguments:
        kind = _category(str(a.type))
        mine = ours.get(a.name)
        if mine is None:
            if kind != "value":
                return False, []
            missing.append(a.name)
        elif kind not in _tc_category(op, mine):
            return False, []
    return True, missing


def _callable(op: OpDef) -> Callable[..., Any]:
    """Call tc.<name> by keyword (the table's overload resolution picks the overload), or
    the method where the op has no function variant (`x.view(...)`, `x.expand(...)`)."""
    name = op.name
    if "function" in op.variants:
        fn = getattr(tc, name)
        return lambda **kw: fn(**kw)

    def method(**kw):
        return getattr(kw.pop("self"), name)(**kw)
    return method


def _generated_rule(overload, op: OpDef, missing: list[str]) -> Rule:
    ours = [a.name for a in op.schema.arguments]
    defaults = {a.name: a.default_value for a in overload._schema.arguments
                if a.name in missing and a.has_default_value()}
    call = _callable(op)

    def convert(**named):
        return call(**{k: v for k, v in named.items() if k in ours})

    def check(named: dict) -> str | None:
        for name in missing:
            value = named.get(name)
            neutral = NEUTRAL.get(name)
            if neutral is not None and neutral(value):
                continue
            if name in defaults and _same(value, defaults[name]):
                continue
            return f"argument {name}={value!r} (tc.{op.name} has no such argument)"
        return None
    return Rule(overload, op.name, convert, op.where, check if missing else None)


def _same(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b) or (a is None and b is None)
    except Exception:   # noqa: BLE001 - tensors and odd objects compare as different
        return False


def _aten_packet(op: OpDef):
    """The ATen operator an ops.yaml entry names: its `torch: ops.aten.<name>` key, else
    its own name (ops.yaml's names are ATen's)."""
    if op.torch == "-" or op.kind == "region":
        return None
    name = op.torch.removeprefix("ops.aten.") if op.torch.startswith("ops.aten.") else op.name
    return getattr(torch.ops.aten, name, None) if name.isidentifier() else None


def generated_rules() -> dict[str, Rule]:
    """The rules ops.yaml gives: for each ATen overload (no out= or in-place variants) of
    an operator that ops.yaml names, the first of ops.yaml's overloads of that name that
    covers it, preferring the one of the same overload name, then the one that lacks
    fewest of its arguments."""
    by_packet: dict[Any, list[OpDef]] = {}
    for op in default_table().values():
        packet = _aten_packet(op)
        if packet is not None:
            by_packet.setdefault(packet, []).append(op)
    rules = {}
    for packet, ops in by_packet.items():
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            schema = overload._schema
            if schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write
                                        for a in schema.arguments):
                continue
            best = None
            for op in ops:
                ok, missing = _covers(overload, op)
                if not ok or not _returns_match(overload, op):
                    continue
                rank = (op.schema.overload != overload_name, len(missing))
                if best is None or rank < best[0]:
                    best = (rank, op, missing)
            if best is not None:
                rule = _generated_rule(overload, best[1], best[2])
                rules[rule.name] = rule
    return rules


# ------------------------------------------------------------------ hand-written rules
HAND: dict[str, Rule] = {}


def hand(*overloads, op: str | None = None, check: Callable[[dict], str | None] | None = None):
    """Register a hand-written rule for these ATen overloads (`torch.ops.aten.x.y`)."""
    def register(fn):
        for overload in overloads:
            rule = Rule(overload, op or fn.__name__, fn, "aten.py", check)
            HAND[rule.name] = rule
        return fn
    return register


aten = torch.ops.aten


def _dims(meta) -> int:
    return meta.dim() if isinstance(meta, torch.Tensor) else -1


def _float(meta) -> bool:
    return isinstance(meta, torch.Tensor) and meta.dtype.is_floating_point


@hand(aten.view.default, aten._unsafe_view.default, aten.reshape.default, op="reshape")
def view(self, size):
    return tc.reshape(self, size)


@hand(aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default, op="(identity)")
def alias(self):
    return self     # values do not change; inside a trace nothing can write to them


@hand(aten._to_copy.default, op="to",
      check=lambda a: None if NEUTRAL["device"](a["device"]) and NEUTRAL["layout"](a["layout"]) else "a copy to another device or layout")
def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return tc.clone(self) if dtype is None else self.to(dtype)


@hand(aten.copy.default, op="to")
def copy(self, src, non_blocking=False):
    return tc.broadcast_to(src.to(self.dtype), self.shape)


@hand(aten.scalar_tensor.default, op="full")
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return tc.full([], s, dtype=torch.float32 if dtype is None else dtype)


@hand(aten.empty.memory_format, op="zeros")
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return tc.zeros(size, dtype=torch.float32 if dtype is None else dtype)


@hand(aten.empty_strided.default, op="zeros")
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return tc.zeros(size, dtype=torch.float32 if dtype is None else dtype)


@hand(aten.empty_permuted.default, op="zeros")
def empty_permuted(size, physical_layout, dtype=None, layout=None, device=None, pin_memory=None):
    """The layout is PyTorch's memory order: tracecomp picks its own."""
    return tc.zeros(size, dtype=torch.float32 if dtype is None else dtype)


@hand(aten.new_empty_strided.default, op="zeros")
def new_empty_strided(self, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return tc.zeros(size, dtype=self.dtype if dtype is None else dtype)


def _new(value):
    def fn(self, size, dtype=None, layout=None, device=None, pin_memory=None):
        return tc.full(size, value, dtype=self.dtype if dtype is None else dtype)
    return fn


for _overload, _value in ((aten.new_zeros.default, 0), (aten.new_ones.default, 1), (aten.new_empty.default, 0)):
    hand(_overload, op="full")(_new(_value))


@hand(aten.new_full.default, op="full")
def new_full(self, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return tc.full(size, fill_value, dtype=self.dtype if dtype is None else dtype)


@hand(aten.fill.Scalar, op="full_like")
def fill(self, value):
    return tc.full_like(self, value)


@hand(aten.rsub.Scalar, aten.rsub.Tensor, op="sub")
def rsub(self, other, alpha=1):
    return tc.sub(other, self, alpha=alpha)


def _no_half_to_float(a: dict) -> str | None:
    return "half_to_float=True" if a["half_to_float"] else None


@hand(aten._softmax.default, op="softmax", check=_no_half_to_float)
def _softmax(self, dim, half_to_float):
    return tc.softmax(self, dim)


@hand(aten._log_softmax.default, op="log_softmax", check=_no_half_to_float)
def _log_softmax(self, dim, half_to_float):
    return tc.log_softmax(self, dim)


@hand(aten._softmax_backward_data.default, op="softmax (backward)")
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    return output * (grad_output - tc.sum(grad_output * output, dim, keepdim=True))


@hand(aten._log_softmax_backward_data.default, op="log_softmax (backward)")
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    return grad_output - tc.exp(output) * tc.sum(grad_output, dim, keepdim=True)


@hand(aten.threshold_backward.default, op="relu (backward)")
def threshold_backward(grad_output, self, threshold):
    return tc.where(self <= threshold, tc.zeros_like(grad_output), grad_output)


@hand(aten.sigmoid_backward.default, op="sigmoid (backward)")
def sigmoid_backward(grad_output, output):
    return grad_output * output * (1 - output)


@hand(aten.tanh_backward.default, op="tanh (backward)")
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


@hand(aten.gelu_backward.default, op="gelu (backward)")
def gelu_backward(grad_output, self, approximate="none"):
    _, pull = vjp(lambda x: tc.gelu(x, approximate=approximate), self)
    return pull(grad_output)[0]


@hand(aten.embedding.default, op="embedding",
      check=lambda a: None if a["indices"].dtype in (torch.int32, torch.int64) else "indices that are not integers")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return tc.embedding(indices, weight)     # padding_idx only changes the backward, which AOT decomposes


def _layer_norm_parts(input, normalized_shape, weight, bias, eps):
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    mean = tc.mean(input, dims, keepdim=True)
    centered = input - mean
    rstd = tc.rsqrt(tc.mean(centered * centered, dims, keepdim=True) + eps)
    out = centered * rstd
    out = out if weight is None else out * weight
    return (out if bias is None else out + bias), mean, rstd


@hand(aten.native_layer_norm.default, op="layer_norm")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    return _layer_norm_parts(input, normalized_shape, weight, bias, eps)


@hand(aten.native_group_norm.default, op="group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = tc.reshape(input, [N, group, C // group * HxW])     # (no -1: N may be 0)
    mean = tc.mean(x, [2], keepdim=True)
    centered = x - mean
    rstd = tc.rsqrt(tc.mean(centered * centered, [2], keepdim=True) + eps)
    out = tc.reshape(centered * rstd, input.shape)
    shape = [1, C] + [1] * (input.dim() - 2)
    out = out if weight is None else out * tc.reshape(weight, shape)
    out = out if bias is None else out + tc.reshape(bias, shape)
    return out, tc.reshape(mean, [N, group]), tc.reshape(rstd, [N, group])


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) as ATen's CPU
    kernels give them: in training the batch's statistics (saved for the backward) and the
    running statistics moved by momentum (with the unbiased variance); in evaluation the
    running statistics normalize and the saved ones are empty."""
    c = input.shape[1]
    shape = [1, c] + [1] * (input.dim() - 2)
    if training:
        dims = [0] + list(range(2, input.dim()))
        n = input.numel() // c
        mean = tc.mean(input, dims)
        centered = input - tc.reshape(mean, shape)
        var = tc.mean(centered * centered, dims)
        invstd = tc.rsqrt(var + eps)
        out = centered * tc.reshape(invstd, shape)
        new_mean = new_var = None
        if running_mean is not None:
            new_mean = running_mean * (1 - momentum) + mean * momentum
            new_var = running_var * (1 - momentum) + var * (momentum * n / max(n - 1, 1))
        saved = (mean, invstd)
    else:
        out = (input - tc.reshape(running_mean, shape)) * tc.reshape(tc.rsqrt(running_var + eps), shape)
        new_mean, new_var = running_mean, running_var
        empty = tc.zeros([0], dtype=input.dtype)
        saved = (empty, empty)
    out = out if weight is None else out * tc.reshape(weight, shape)
    out = out if bias is None else out + tc.reshape(bias, shape)
    return (out, *saved, new_mean, new_var)


def _needs_stats(a: dict) -> str | None:
    if not a["training"] and a["running_mean"] is None:
        return "evaluation without running statistics"
    return None


@hand(aten._native_batch_norm_legit_functional.default, op="batch_norm", check=_needs_stats)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@hand(aten._native_batch_norm_legit_no_training.default, op="batch_norm")
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@hand(aten._native_batch_norm_legit.no_stats, op="batch_norm",
      check=lambda a: None if a["training"] else "evaluation without running statistics")
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@hand(aten.native_batch_norm.default, op="batch_norm", check=_needs_stats)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


def _conv_check(a: dict) -> str | None:
    dims = _dims(a["input"])
    if a["transposed"]:
        return None if dims == 4 else f"a transposed convolution over {dims - 2} spatial dims (tracecomp has conv_transpose2d)"
    if dims not in (3, 4):
        return f"a convolution over {dims - 2} spatial dims (tracecomp has conv1d and conv2d)"
    return None


def _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return tc.conv_transpose2d(input, weight, bias, list(stride), list(padding), list(output_padding),
                                   groups, list(dilation))
    if input.dim() == 3:
        return tc.conv1d(input, weight, bias, list(stride), list(padding), list(dilation), groups)
    return tc.conv2d(input, weight, bias, list(stride), list(padding), list(dilation), groups)


@hand(aten.convolution.default, op="conv", check=_conv_check)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@hand(aten.convolution_backward.default, op="conv (backward)", check=_conv_check)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    """The VJP of tracecomp's convolution (derivatives.yaml differentiates its pieces);
    the bias gradient is the output gradient summed over all but the channel dim."""
    _, pull = vjp(lambda x, w: _conv(x, w, None, stride, padding, dilation, transposed, output_padding, groups),
                  input, weight)
    grad_input, grad_weight = pull(grad_output)
    grad_bias = tc.sum(grad_output, [0] + list(range(2, grad_output.dim()))) if output_mask[2] else None
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


def _pool_check(a: dict) -> str | None:
    return None if _dims(a["self"]) in (3, 4) else "pooling over other than 2 spatial dims"


@hand(aten.max_pool2d_with_indices.default, op="max_pool2d", check=_pool_check)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return tuple(tc.max_pool2d(self, list(kernel_size), list(stride) or None, list(padding), list(dilation),
                               ceil_mode, return_indices=True))


@hand(aten.max_pool2d_with_indices_backward.default, op="max_pool2d (backward)", check=_pool_check)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scattered_at(grad_output, self, indices)


@hand(aten.adaptive_max_pool2d.default, op="adaptive_max_pool2d", check=_pool_check)
def adaptive_max_pool2d(self, output_size):
    return tuple(tc.adaptive_max_pool2d(self, list(output_size), return_indices=True))


@hand(aten.adaptive_max_pool2d_backward.default, op="adaptive_max_pool2d (backward)", check=_pool_check)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scattered_at(grad_output, self, indices)


def _scattered_at(grad_output, self, indices):
    """Each output gradient added at the input position its saved index names (h * W + w
    in its plane), as PyTorch's max-pooling backward kernels do."""
    lead = list(self.shape[:-2])
    plane = self.shape[-2] * self.shape[-1]
    flat = tc.zeros(lead + [plane], dtype=grad_output.dtype)
    spread = tc.scatter_add(flat, -1, tc.reshape(indices, lead + [-1]), tc.reshape(grad_output, lead + [-1]))
    return tc.reshape(spread, self.shape)


@hand(aten.avg_pool2d.default, op="avg_pool2d", check=_pool_check)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return tc.avg_pool2d(self, list(kernel_size), list(stride) or None, list(padding), ceil_mode,
                         count_include_pad, divisor_override)


@hand(aten.avg_pool2d_backward.default, op="avg_pool2d (backward)", check=_pool_check)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    _, pull = vjp(lambda x: avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                       divisor_override), self)
    return pull(grad_output)[0]


@hand(aten._adaptive_avg_pool2d.default, op="adaptive_avg_pool2d", check=_pool_check)
def _adaptive_avg_pool2d(self, output_size):
    return tc.adaptive_avg_pool2d(self, list(output_size))


@hand(aten._adaptive_avg_pool2d_backward.default, op="adaptive_avg_pool2d (backward)", check=_pool_check)
def _adaptive_avg_pool2d_backward(grad_output, self):
    size = list(grad_output.shape[-2:])
    _, pull = vjp(lambda x: tc.adaptive_avg_pool2d(x, size), self)
    return pull(grad_output)[0]


@hand(aten.native_dropout.default, op="dropout",
      check=lambda a: None if _float(a["input"]) else "dropout of a tensor that is not floating point")
def native_dropout(input, p, train):
    """(output, mask): the mask drawn from tracecomp's generator (tc.manual_seed), not
    PyTorch's, so the dropped elements differ from eager's for the same seed."""
    if not train or p == 0:
        return input, tc.ones(input.shape, dtype=torch.bool)
    mask = tc.rand(input.shape, dtype=input.dtype) >= p
    out = input * mask.to(input.dtype) * (1.0 / (1.0 - p)) if p < 1 else input * 0
    return out, mask


@hand(aten.native_dropout_backward.default, op="dropout (backward)")
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask.to(grad_output.dtype) * scale


def _integer_indices(a: dict) -> str | None:
    for t in a["indices"]:
        if t is not None and t.dtype not in (torch.int32, torch.int64):
            return "indexing with a bool mask (a result shape that depends on the data)"
    return None


@hand(aten.index.Tensor, aten._unsafe_index.Tensor, op="index", check=_integer_indices)
def index(self, indices):
    return self[tuple(slice(None) if i is None else i for i in indices)]


def _replication_pad_backward(grad_output, self, padding):
    """The VJP of tracecomp's replicate padding (Core ATen decomposes the forward only)."""
    _, pull = vjp(lambda x: tc.pad(x, list(padding), mode="replicate"), self)
    return pull(grad_output)[0]


hand(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
     aten.replication_pad3d_backward.default, op="pad (backward)")(_replication_pad_backward)


@hand(aten.repeat_interleave.Tensor, op="repeat_interleave",
      check=lambda a: None if a["output_size"] is not None else "repeat counts in a tensor without output_size")
def repeat_interleave_tensor(repeats, output_size=None):
    """The positions i repeated repeats[i] times: output j's is how many running totals of
    repeats are <= j (output_size, which Dynamo records, fixes the result's length)."""
    ends = tc.cumsum(repeats, 0)
    at = tc.arange(output_size, dtype=ends.dtype)
    return tc.sum((tc.unsqueeze(ends, 0) <= tc.unsqueeze(at, 1)).to(ends.dtype), 1).to(repeats.dtype)


@hand(aten.put.default, op="index_add")
def put(self, index, source, accumulate=False):
    """`self` flattened, `source` written (or added) at `index` (negative: from the end)."""
    flat, where = tc.reshape(self, [-1]), tc.reshape(index, [-1])
    where = tc.where(where < 0, where + flat.shape[0], where)
    values = tc.reshape(source, [-1])
    put_into = tc.index_add if accumulate else tc.index_copy
    return tc.reshape(put_into(flat, 0, where, values), list(self.shape))


@hand(aten.elu.default, op="elu")
def elu(self, alpha=1, scale=1, input_scale=1):
    """ATen's elu with selu's scales: scale * (x > 0 ? x : alpha * (exp(x * input_scale) - 1))."""
    if scale == 1 and input_scale == 1:
        return tc.elu(self, alpha)
    return tc.where(self > 0, self, tc.expm1(self * input_scale) * alpha) * scale


@hand(aten._cdist_forward.default, op="cdist")
def _cdist_forward(x1, x2, p, compute_mode=None):
    return tc.cdist(x1, x2, p)


@hand(aten._cdist_backward.default, op="cdist")
def _cdist_backward(grad, x1, x2, p, cdist):
    """x1's gradient: tracecomp's own derivative of cdist (ATen's returns x1's alone)."""
    _, pull = vjp(lambda a: tc.cdist(a, x2, p), x1)
    return pull(grad)[0]


def _kv_groups(query, key) -> int:
    """How many query heads share each key/value head (dim -3): 1 without grouping."""
    if query.dim() < 3 or key.dim() < 3 or query.shape[-3] == key.shape[-3]:
        return 1
    return query.shape[-3] // key.shape[-3]


def _grouped_heads(a: dict) -> str | None:
    q, k = a["query"], a["key"]
    if q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3] and (k.shape[-3] == 0 or q.shape[-3] % k.shape[-3]):
        return f"{q.shape[-3]} query heads over {k.shape[-3]} key/value heads (not a multiple)"
    return None


def _shared_heads(t, groups: int):
    """Each key/value head repeated for the query heads that share it (grouped-query attention)."""
    return t if groups == 1 else tc.repeat_interleave(t, groups, -3)


def _summed_heads(grad, groups: int):
    """A repeated head's gradient summed back over the query heads that shared it."""
    if groups == 1:
        return grad
    shape = list(grad.shape)
    return tc.sum(tc.reshape(grad, shape[:-3] + [shape[-3] // groups, groups] + shape[-2:]), -3)


@hand(aten._scaled_dot_product_flash_attention_for_cpu.default, op="_scaled_dot_product_flash_attention_for_cpu",
      check=_grouped_heads)
def flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """ATen's CPU kernel takes fewer key/value heads than query heads (sdpa's enable_gqa,
    as Llama calls it); tracecomp's fused op takes them repeated."""
    groups = _kv_groups(query, key)
    return tuple(tc._scaled_dot_product_flash_attention_for_cpu(
        query, _shared_heads(key, groups), _shared_heads(value, groups), dropout_p, is_causal,
        attn_mask=attn_mask, scale=scale))


@hand(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
      op="_scaled_dot_product_flash_attention_for_cpu_backward", check=_grouped_heads)
def flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                                     attn_mask=None, scale=None):
    groups = _kv_groups(query, key)
    grad_q, grad_k, grad_v = tc._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, _shared_heads(key, groups), _shared_heads(value, groups), out, logsumexp, dropout_p,
        is_causal, attn_mask=attn_mask, scale=scale)
    return grad_q, _summed_heads(grad_k, groups), _summed_heads(grad_v, groups)


def rules() -> dict[str, Rule]:
    """Every rule: the generated ones, replaced by the hand-written ones of the same name."""
    return {**generated_rules(), **HAND}


@functools.cache
def table() -> dict[Any, Rule]:
    """The rules by OpOverload (an FX node's target)."""
    return {rule.overload: rule for rule in rules().values()}


def rule_for(target) -> Rule | None:
    return table().get(target)
