"""The layers of torch.nn with PyTorch's constructor arguments, defaults, initialization
(tc.nn.init, seeded by tc.manual_seed), parameter and buffer names (so state dicts load
across the two) and repr.  Each forward is one call of tc.nn.functional."""
from __future__ import annotations

import math

from ..core.errors import ArgumentError
from . import functional as F, init
from .module import Module, Parameter
from ..dispatch import api as tc


def _pair(v, n: int, what: str) -> tuple:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
    if len(t) != n:
        raise ArgumentError(f"{what}: expected an int or {n} ints, got {v!r}")
    return t


def empty_parameter(*shape, dtype=None) -> Parameter:
    return Parameter(tc.empty(shape, dtype=dtype or tc.float32))


def _fan_in_uniform_(t, fan_in: int) -> None:
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    init.uniform_(t, -bound, bound)


def _affine(m: Module, shape, weight: bool, bias: bool, dtype) -> None:
    """A normalization's `weight` (ones) and `bias` (zeros) of `shape`, or None for each it
    does not have (registered, so state dicts name them as PyTorch's do)."""
    for name, wanted, fill in (("weight", weight, tc.ones), ("bias", bias, tc.zeros)):
        if wanted:
            setattr(m, name, Parameter(fill(shape, dtype=dtype or tc.float32)))
        else:
            m.register_parameter(name, None)


def _positive(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentError(f"{what} must be a positive int, got {value!r}")


# ---------------------------------------------------------------- linear
class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None):
        super().__init__()
        _positive(in_features, "Linear: in_features")
        _positive(out_features, "Linear: out_features")
        self.in_features, self.out_features = in_features, out_features
        self.weight = empty_parameter(out_features, in_features, dtype=dtype)
        self.bias = empty_parameter(out_features, dtype=dtype) if bias else None
        if not bias:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))     # bound 1/sqrt(fan_in)
        if self.bias is not None:
            _fan_in_uniform_(self.bias, self.in_features)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """y = x1^T W x2 + b, W of shape (out, in1, in2)."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, dtype=None):
        super().__init__()
        for v, what in ((in1_features, "in1_features"), (in2_features, "in2_features"), (out_features, "out_features")):
            _positive(v, f"Bilinear: {what}")
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = empty_parameter(out_features, in1_features, in2_features, dtype=dtype)
        self.bias = empty_parameter(out_features, dtype=dtype) if bias else None
        if not bias:
            self.register_parameter("bias", None)
        bound = 1 / math.sqrt(in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x1, x2):
        y = tc.einsum("...i,oij,...j->...o", x1, self.weight, x2)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return tc.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


# ---------------------------------------------------------------- convolution
class _ConvNd(Module):
    _dims = 2
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", output_padding=0, dtype=None):
        super().__init__()
        name, n = type(self).__name__, self._dims
        _positive(in_channels, f"{name}: in_channels")
        _positive(out_channels, f"{name}: out_channels")
        _positive(groups, f"{name}: groups")
        if in_channels % groups or out_channels % groups:
            raise ArgumentError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) "
                                f"must both divide by groups ({groups})")
        if padding_mode != "zeros":
            raise ArgumentError(f"{name}: padding_mode {padding_mode!r} is not supported (only 'zeros'; "
                                "pad with tc.nn.functional.pad first)")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, n, f"{name}: kernel_size")
        self.stride = _pair(stride, n, f"{name}: stride")
        self.padding = padding if isinstance(padding, str) else _pair(padding, n, f"{name}: padding")
        self.dilation = _pair(dilation, n, f"{name}: dilation")
        self.output_padding = _pair(output_padding, n, f"{name}: output_padding")
        self.padding_mode = padding_mode
        shape = ((in_channels, out_channels // groups) if self._transposed
                 else (out_channels, in_channels // groups)) + self.kernel_size
        self.weight = empty_parameter(*shape, dtype=dtype)
        self.bias = empty_parameter(out_channels, dtype=dtype) if bias else None
        if not bias:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight)
            _fan_in_uniform_(self.bias, fan_in)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * self._dims:
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * self._dims:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * self._dims:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class Conv1d(_ConvNd):
    _dims = 1

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(_ConvNd):
    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0,
                 groups=1, bias=True, dilation=1, padding_mode="zeros", dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, output_padding, dtype)

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


# ---------------------------------------------------------------- pooling
class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride if stride is not None else kernel_size, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


# ---------------------------------------------------------------- normalization
class _BatchNorm(Module):
    _ndims: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype=None):
        super().__init__()
        _positive(num_features, f"{type(self).__name__}: num_features")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _affine(self, (num_features,), affine, affine, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", tc.zeros(num_features, dtype=dtype or tc.float32))
            self.register_buffer("running_var", tc.ones(num_features, dtype=dtype or tc.float32))
            self.register_buffer("num_batches_tracked", tc.tensor(0, dtype=tc.int64))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def forward(self, x):
        if x.ndim not in self._ndims:
            raise ArgumentError(f"{type(self).__name__}: expected a {' or '.join(map(str, self._ndims))}-D "
                                f"input, got shape {tuple(x.shape)}")
        from ..autograd.grad_mode import no_grad
        tracked = self.training and self.track_running_stats
        if tracked:
            with no_grad():
                self.num_batches_tracked.add_(1)
        if tracked and self.momentum is None:
            # a cumulative average of the batches' statistics: its factor 1/n is a tensor (the
            # step count is data, so a compiled step does not retrace), so update it here
            out = F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
            with no_grad():
                dims = [0] + list(range(2, x.ndim))
                factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
                self.running_mean.copy_(self.running_mean + (x.mean(dims) - self.running_mean) * factor)
                self.running_var.copy_(self.running_var + (x.var(dims) - self.running_var) * factor)
            return out
        use_running = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if use_running else None, self.running_var if use_running else None,
                            self.weight, self.bias, self.training or not self.track_running_stats,
                            self.momentum or 0.0, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _ndims = (4,)


def _shape(normalized_shape) -> tuple:
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 dtype=None):
        super().__init__()
        self.normalized_shape, self.eps, self.elementwise_affine = _shape(normalized_shape), eps, elementwise_affine
        self.has_bias = bias
        _affine(self, self.normalized_shape, elementwise_affine, elementwise_affine and bias, dtype)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
                + (f", bias={self.has_bias}" if self.elementwise_affine else ""))


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, dtype=None):
        super().__init__()
        _positive(num_groups, "GroupNorm: num_groups")
        if num_channels % num_groups:
            raise ArgumentError(f"GroupNorm: num_channels ({num_channels}) must divide by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        _affine(self, (num_channels,), affine, affine, dtype)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, dtype=None):
        super().__init__()
        self.normalized_shape, self.eps, self.elementwise_affine = _shape(normalized_shape), eps, elementwise_affine
        _affine(self, self.normalized_shape, elementwise_affine, False, dtype)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


# ---------------------------------------------------------------- embedding, dropout
class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, dtype=None):
        super().__init__()
        _positive(num_embeddings, "Embedding: num_embeddings")
        _positive(embedding_dim, "Embedding: embedding_dim")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ArgumentError(f"Embedding: padding_idx {padding_idx} is out of range for "
                                    f"{num_embeddings} embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = empty_parameter(num_embeddings, embedding_dim, dtype=dtype)
        init.normal_(self.weight)
        if padding_idx is not None:
            from ..autograd.grad_mode import no_grad
            with no_grad():
                self.weight[padding_idx] = 0.0

    def forward(self, x):
        return F.embedding(x, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ArgumentError(f"Dropout: p must be in [0, 1], got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


# ---------------------------------------------------------------- activations
def _activation(name: str, fn, params: tuple = ()):
    """A module class calling `fn(x, *its arguments)`, with PyTorch's name and arguments."""
    def __init__(self, *args, **kwargs):
        Module.__init__(self)
        values = dict(params)
        names = [p for p, _ in params]
        if len(args) > len(names):
            raise ArgumentError(f"{name} takes at most {len(names)} argument(s), got {len(args)}")
        values.update(zip(names, args))
        for k, v in kwargs.items():
            if k not in values:
                raise ArgumentError(f"{name}: unexpected argument '{k}'")
            values[k] = v
        for k, v in values.items():
            setattr(self, k, v)

    def forward(self, x):
        return fn(x, **{p: getattr(self, p) for p, _ in params if p != "inplace"})

    def extra_repr(self):
        return ", ".join(f"{p}={getattr(self, p)}" for p, _ in params if p != "inplace")
    return type(name, (Module,), {"__init__": __init__, "forward": forward, "extra_repr": extra_repr,
                                  "__module__": __name__, "__qualname__": name})


ReLU = _activation("ReLU", lambda x: F.relu(x), (("inplace", False),))
ReLU6 = _activation("ReLU6", lambda x: F.relu6(x), (("inplace", False),))
SiLU = _activation("SiLU", lambda x: F.silu(x), (("inplace", False),))
Sigmoid = _activation("Sigmoid", lambda x: F.sigmoid(x))
Tanh = _activation("Tanh", lambda x: F.tanh(x))
Mish = _activation("Mish", lambda x: F.mish(x), (("inplace", False),))
Softsign = _activation("Softsign", lambda x: F.softsign(x))
Hardswish = _activation("Hardswish", lambda x: F.hardswish(x), (("inplace", False),))
Hardsigmoid = _activation("Hardsigmoid", lambda x: F.hardsigmoid(x), (("inplace", False),))
GELU = _activation("GELU", lambda x, approximate: F.gelu(x, approximate=approximate), (("approximate", "none"),))
LeakyReLU = _activation("LeakyReLU", lambda x, negative_slope: F.leaky_relu(x, negative_slope),
                        (("negative_slope", 0.01), ("inplace", False)))
ELU = _activation("ELU", lambda x, alpha: F.elu(x, alpha), (("alpha", 1.0), ("inplace", False)))
Softplus = _activation("Softplus", lambda x, beta, threshold: F.softplus(x, beta, threshold),
                       (("beta", 1.0), ("threshold", 20.0)))
Hardtanh = _activation("Hardtanh", lambda x, min_val, max_val: F.hardtanh(x, min_val, max_val),
                       (("min_val", -1.0), ("max_val", 1.0), ("inplace", False)))
Softmax = _activation("Softmax", lambda x, dim: F.softmax(x, dim), (("dim", None),))
LogSoftmax = _activation("LogSoftmax", lambda x, dim: F.log_softmax(x, dim), (("dim", None),))
