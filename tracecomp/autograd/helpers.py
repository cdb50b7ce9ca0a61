"""Named helper functions that derivative formulas may call, besides the ops of ops.yaml.

Each is written once, in terms of tensor ops (so it works eagerly, traced, and under
autograd for higher derivatives: every op a helper calls has a derivatives.yaml entry or
is composite).  Formulas stay one line; the logic lives here.  Helpers that serve several
inputs (`self, other: f(..., grad_input_mask)`) return one gradient per input, None where
the mask says it is not needed.  Arguments declared `Tensor` in ops.yaml may arrive as
Python numbers (`x * 2`, `tc.maximum(x, 0.5)`) or None (`clamp(x, max=1)`); helpers that
read them say so and cope.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable

from ..dispatch import api as tc
from ..ops.rules import slice_bounds, wrap_index

INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SQRT1_2 = math.sqrt(0.5)
GELU_BETA = math.sqrt(2.0 / math.pi)
GELU_KAPPA = 0.044715


def _is_number(x) -> bool:
    return isinstance(x, numbers.Number)


# ---------------------------------------------------------------- broadcasting and reductions

def sum_to(grad, shape: tuple[int, ...]):
    """Undo broadcasting: sum `grad` over the dims that broadcasting added or expanded to `shape`."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1]
    out = grad.sum(dims, keepdim=True) if dims else grad
    return out.reshape(shape) if tuple(out.shape) != shape else out


def reduced_dims(shape: tuple[int, ...], dim) -> list[int]:
    """The dims a reduction with `dim` (None, int or list; negatives allowed) removed."""
    n = len(shape)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(n))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted(d % n for d in dims) if n else []


def reduced_numel(shape: tuple[int, ...], dim) -> int:
    """How many input elements meet in each output element of a reduction over `dim`."""
    return math.prod(shape[d] for d in reduced_dims(shape, dim))


def unsqueeze_reduced(grad, shape: tuple[int, ...], dim, keepdim: bool):
    """Give a reduction's gradient back the reduced dims (size 1) that keepdim=False removed."""
    if keepdim:
        return grad
    for d in reduced_dims(shape, dim):
        grad = grad.unsqueeze(d)
    return grad


def sum_backward(grad, shape: tuple[int, ...], dim, keepdim: bool):
    """sum: every input element gets its output element's gradient."""
    return unsqueeze_reduced(grad, shape, dim, keepdim).expand(tuple(shape))


def mean_backward(grad, shape: tuple[int, ...], dim, keepdim: bool):
    """mean: the sum's gradient divided by the number of elements reduced."""
    return sum_backward(grad, shape, dim, keepdim) / reduced_numel(shape, dim)


def _max_mask(self, result, dim, keepdim: bool, nan_matches: bool = False):
    """Where `self` equals its reduction's (restored) `result`; with nan_matches, NaN
    elements also match a NaN result."""
    r = unsqueeze_reduced(result, self.shape, dim, keepdim)
    mask = self == r
    return tc.logical_or(mask, tc.logical_and(self != self, r != r)) if nan_matches else mask


def amax_backward(grad, self, result, dim, keepdim: bool):
    """amax/amin: the gradient is split evenly among the tied extreme elements, as PyTorch
    does (scale_grad_by_count: the subgradient that treats ties symmetrically)."""
    mask = _max_mask(self, result, dim, keepdim)
    count = mask.sum(reduced_dims(self.shape, dim), keepdim=True)
    return tc.where(mask, unsqueeze_reduced(grad, self.shape, dim, keepdim) / count, 0)


def evenly_distribute_backward(grad, self, result):
    """max()/min() of all elements: like amax, and a NaN result's gradient is shared by the
    NaN elements (PyTorch's evenly_distribute_backward)."""
    mask = _max_mask(self, result, None, False, nan_matches=True)
    return tc.where(mask, grad / mask.sum(), 0)


def amax_jvp(self_p, self_t, result, dim, keepdim: bool):
    """Forward mode of amax/amin/max()/min(): the mean of the tangents of the tied extreme elements."""
    mask = _max_mask(self_p, result, dim, keepdim)
    dims = reduced_dims(self_p.shape, dim)
    return tc.where(mask, self_t, 0).sum(dims, keepdim=keepdim) / mask.sum(dims, keepdim=keepdim)


def prod_backward(grad, self, dim, keepdim: bool):
    """prod: d prod / d x_i = product of the other elements, computed without dividing by
    zero as (product of the nonzero elements, divided by x_i if x_i != 0) times a factor
    that is 1 without zeros; with one zero, 1 for x_i the zero and the zero itself for the
    others; with two zeros, the *other* zero for each of them and 0 for the rest; 0 with
    three or more.  "The zero itself" is the value 0 carried by an expression whose
    gradient reaches that element, so the formula differentiates again exactly: first and
    second derivatives are exact everywhere; third and higher ones are exact except where
    a reduced group holds three or more zeros (there they come out as 0)."""
    if self.dtype.is_half and grad.dtype is self.dtype:       # in float32, rounded once
        return prod_backward(grad.float(), self.float(), dim, keepdim).to(self.dtype)
    dims = reduced_dims(self.shape, dim)
    is_zero = self == 0
    safe = tc.where(is_zero, 1, self)
    zeros = is_zero.sum(dims, keepdim=True)
    nonzero_prod = safe.prod(dims, keepdim=True)
    the_zeros = tc.where(is_zero, self, 0).sum(dims, keepdim=True)     # value 0, gradient 1 to each zero
    one_zero = tc.where(is_zero, 1, the_zeros)
    two_zeros = tc.where(is_zero, the_zeros - self, 0)                 # the other zero, for a zero x_i
    factor = tc.where(zeros == 0, 1, tc.where(zeros == 1, one_zero, tc.where(zeros == 2, two_zeros, 0)))
    return unsqueeze_reduced(grad, self.shape, dim, keepdim) * (nonzero_prod / safe) * factor


def prod_jvp(self_p, self_t, result, dim, keepdim: bool):
    """Forward mode of prod: sum over the reduced dims of (d prod / d x_i) * x_t_i, in the
    result's dtype (prod(x, dtype=...))."""
    dims = reduced_dims(self_p.shape, dim)
    ones = tc.ones(unsqueeze_reduced_shape(self_p.shape, dims, keepdim), dtype=self_t.dtype)
    out = (prod_backward(ones, self_p, dim, keepdim) * self_t).sum(dims, keepdim=keepdim)
    return out if out.dtype == result.dtype else out.to(result.dtype)


def reverse_cumsum(x, dim: int):
    """out[i] = sum of x[j] for j >= i along dim: cumsum's gradient."""
    return x.flip([dim]).cumsum(dim).flip([dim])


def _zero_positions(self, dim: int):
    """(before, first): masks of the elements before self's first zero along dim, and of
    that first zero."""
    is_zero = self == 0
    zeros_so_far = is_zero.cumsum(dim)
    return zeros_so_far == 0, is_zero & (zeros_so_far == 1)


def cumprod_backward(grad, self, result, dim: int):
    """cumprod: d out_i / d x_k = prod_{j <= i, j != k} x_j for k <= i, without dividing by
    zero.  Before the first zero z, that is out_i / x_k (exact: x_k != 0); at z it is
    cumprod of x with x_z replaced by 1, at i; after z it is 0 (x_z is a factor).  Half
    tensors: in float32 from the unrounded products, rounded once (the reverse sums of half
    terms missed by 2.5e-2 relative on OpInfo's bf16 samples)."""
    if self.ndim == 0:
        return grad
    if self.dtype.is_half and grad.dtype is self.dtype:
        wide = self.float()
        return cumprod_backward(grad.float(), wide, wide.cumprod(dim), dim).to(self.dtype)
    before, first = _zero_positions(self, dim)
    at_before = reverse_cumsum(grad * result, dim) / tc.where(before, self, 1)
    at_first = reverse_cumsum(grad * tc.where(first, 1, self).cumprod(dim), dim)
    return tc.where(before, at_before, tc.where(first, at_first, 0))


def cumprod_jvp(self_p, self_t, result, dim: int):
    """Forward mode of cumprod: out_i * cumsum(t / x)_i before the first zero z; after it,
    only x_z's tangent moves out_i: t_z * cumprod(x with x_z replaced by 1)_i."""
    if self_p.ndim == 0:
        return self_t
    before, first = _zero_positions(self_p, dim)
    t_first = tc.where(first, self_t, 0).sum(dim, keepdim=True)
    after = t_first * tc.where(first, 1, self_p).cumprod(dim)
    return tc.where(before, result * (self_t / tc.where(before, self_p, 1)).cumsum(dim), after)


def _signed_logcumsumexp(log_magnitude, weights, dim: int, reverse: bool):
    """sum over a running window of weights * exp(log_magnitude), in log space for the
    positive and the negative weights separately (no overflow): (log of the positive
    part, log of the negative part)."""

    def running(w):
        logs = tc.where(w > 0, log_magnitude + tc.log(tc.where(w > 0, w, 1)), float("-inf"))
        return logs.flip([dim]).logcumsumexp(dim).flip([dim]) if reverse else logs.logcumsumexp(dim)
    return running(weights), running(-weights)


def logcumsumexp_backward(grad, self, result, dim: int):
    """logcumsumexp: grad_k = sum_{i >= k} grad_i exp(x_k - out_i), summed in log space, in
    float64 (_wide): the running log-sums are as large as the inputs, and x_k + log-sum
    cancels to a small exponent, so float32's rounding of the two (5e-4 at 1e4, OpInfo's
    sample) became an error of the gradient (1e-3 relative; PyTorch's float32 has it too).
    PyTorch's CPU kernels accumulate float32 in double likewise."""
    if self.ndim == 0:
        return grad
    x, out, g = _wide(self, result, grad)
    if result.dtype.is_half:    # its rounding (an ulp of the log-sums) would move every exponent
        out = tc.logcumsumexp(x, dim)
    pos, neg = _signed_logcumsumexp(-out, g, dim, reverse=True)
    return (tc.exp(x + pos) - tc.exp(x + neg)).to(grad.dtype)


def logcumsumexp_jvp(self_p, self_t, result, dim: int):
    """Forward mode: out_t_i = sum_{k <= i} t_k exp(x_k - out_i), summed in log space, in
    float64 for the reason logcumsumexp_backward gives."""
    if self_p.ndim == 0:
        return self_t
    x, t, out = _wide(self_p, self_t, result)
    pos, neg = _signed_logcumsumexp(x, t, dim, reverse=False)
    return (tc.exp(pos - out) - tc.exp(neg - out)).to(self_t.dtype)


def _wide(*tensors):
    """The tensors in float64 (the float64 ones as they are)."""
    return [t if t.dtype == tc.float64 else t.to(tc.float64) for t in tensors]


def unsqueeze_reduced_shape(shape: tuple[int, ...], dims: list[int], keepdim: bool) -> tuple[int, ...]:
    """The result shape of a reduction over `dims` (already normalized)."""
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _var_scale(shape, dim, correction) -> float:
    """2 / (N - correction), inf where N - correction <= 0 (the variance is then inf/nan too)."""
    n = reduced_numel(shape, dim) - (1 if correction is None else correction)
    return 2.0 / n if n > 0 else math.inf


def var_backward(grad, self, dim, correction, keepdim: bool):
    """var: 2 / (N - correction) * grad * (x - mean(x))."""
    dims = reduced_dims(self.shape, dim)
    centered = self - self.mean(dims, keepdim=True)
    return unsqueeze_reduced(grad, self.shape, dim, keepdim) * centered * _var_scale(self.shape, dim, correction)


def var_jvp(self_p, self_t, dim, correction, keepdim: bool):
    """Forward mode of var: 2 / (N - correction) * sum(x_t * (x - mean(x)))."""
    dims = reduced_dims(self_p.shape, dim)
    centered = self_p - self_p.mean(dims, keepdim=True)
    return (self_t * centered).sum(dims, keepdim=keepdim) * _var_scale(self_p.shape, dim, correction)


def _safe_half_over(grad, result):
    """grad / (2 * result), 0 where result == 0 (PyTorch's std_backward masks those)."""
    is_zero = result == 0
    return tc.where(is_zero, 0, grad / (2 * tc.where(is_zero, 1, result)))


def std_backward(grad, self, result, dim, correction, keepdim: bool):
    """std = sqrt(var): var's gradient with grad / (2 std); 0 where std == 0."""
    return var_backward(_safe_half_over(grad, result), self, dim, correction, keepdim)


def std_jvp(self_p, self_t, result, dim, correction, keepdim: bool):
    return _safe_half_over(var_jvp(self_p, self_t, dim, correction, keepdim), result)


def value_selecting_reduction_backward(grad, dim: int, indices, shape: tuple[int, ...], keepdim: bool):
    """max.dim/min.dim: the gradient goes to the selected element (scatter at `indices`)."""
    if len(shape) == 0:
        return grad
    if not keepdim:
        grad, indices = grad.unsqueeze(dim), indices.unsqueeze(dim)
    return tc.scatter_add(tc.zeros(tuple(shape), dtype=grad.dtype), dim, indices, grad)


def gather_with_keepdimed_indices(self_t, dim: int, indices, keepdim: bool):
    """Forward mode of max.dim/min.dim: the tangent at the selected elements."""
    if self_t.ndim == 0:
        return self_t
    if keepdim:
        return tc.gather(self_t, dim, indices)
    return tc.gather(self_t, dim, indices.unsqueeze(dim)).squeeze(dim)


# ---------------------------------------------------------------- elementwise

def pow_backward_self(grad, self, exponent):
    """d x**e / dx = e * x**(e-1); 0 where e == 0 (so 0**0 has gradient 0, not nan).
    `self` may be a Python number (`2 ** x`) and `exponent` a Python number (`x ** 2`)."""
    if _is_number(exponent):
        return grad * 0 if exponent == 0 else grad * exponent * tc.pow(self, exponent - 1)
    return tc.where(exponent == 0, 0, grad * exponent * tc.pow(self, exponent - 1))


def pow_backward_exponent(grad, self, exponent, result):
    """d x**e / de = x**e * log(x); 0 where x == 0 and e >= 0 (PyTorch's convention), computed
    without log(0) so that second derivatives stay finite.  `self` may be a Python number."""
    if _is_number(self):
        return grad * 0 if self == 0 else grad * result * math.log(self)
    cond = tc.logical_and(self == 0, exponent >= 0)
    return tc.where(cond, 0, grad * result * tc.log(tc.where(cond, 1, self)))


def pow_jvp(self_p, self_t, exponent_p, exponent_t, result):
    """Forward mode of pow: x_t * d/dx + e_t * d/de (tangents of Python numbers are 0)."""
    terms = []
    if not _is_number(self_t):
        terms.append(pow_backward_self(self_t, self_p, exponent_p))
    if not _is_number(exponent_t):
        terms.append(pow_backward_exponent(exponent_t, self_p, exponent_p, result))
    return terms[0] + terms[1] if len(terms) == 2 else terms[0]


def _split_ties(grad, self, other, chosen_if_greater: bool):
    """maximum/minimum's gradient for `self`: none where self loses, half on ties, else all
    of it (PyTorch's masks: so where a NaN is involved both inputs get the gradient)."""
    loses = self < other if chosen_if_greater else self > other
    return tc.where(self == other, grad / 2, tc.where(loses, 0, grad))


def maximum_backward(grad, self, other, grad_input_mask):
    """maximum: the larger input gets the gradient; ties split it evenly, as PyTorch does."""
    return (_split_ties(grad, self, other, True) if grad_input_mask[0] else None,
            _split_ties(grad, other, self, True) if grad_input_mask[1] else None)


def minimum_backward(grad, self, other, grad_input_mask):
    """minimum: the smaller input gets the gradient; ties split it evenly, as PyTorch does."""
    return (_split_ties(grad, self, other, False) if grad_input_mask[0] else None,
            _split_ties(grad, other, self, False) if grad_input_mask[1] else None)


def maximum_jvp(self_p, self_t, other_p, other_t, greater: bool = True):
    """Forward mode of maximum (minimum with greater=False): the winner's tangent, the mean on ties."""
    wins = self_p > other_p if greater else self_p < other_p
    weight = tc.where(self_p == other_p, 0.5, tc.where(wins, 1.0, 0.0))
    return other_t + weight * (self_t - other_t)


def atan2_backward(grad, self, other, grad_input_mask):
    """atan2(y, x): dy = x / (x^2 + y^2), dx = -y / (x^2 + y^2)."""
    denom = self * self + other * other
    return (grad * other / denom if grad_input_mask[0] else None,
            -grad * self / denom if grad_input_mask[1] else None)


def _clamp_masks(self, min, max):
    """(self kept, min chosen, max chosen) for minimum(maximum(self, min), max), as PyTorch:
    ties go to self; if min > max the result is max everywhere."""
    if min is not None and max is not None:
        keep = tc.logical_and(self >= min, self <= max)
        min_chosen = tc.logical_and(self < min, min < max)
        max_chosen = tc.logical_or(self > max, max < min)
        return keep, min_chosen, max_chosen
    if min is not None:
        return self >= min, self < min, None
    if max is not None:
        return self <= max, None, self > max
    return None, None, None


def clamp_backward(grad, self, min, max, grad_input_mask):
    """clamp with optional (Tensor or number) bounds: each element's gradient goes to whichever
    of self, min, max the result took it from."""
    keep, min_chosen, max_chosen = _clamp_masks(self, min, max)
    out = [None, None, None]
    if grad_input_mask[0]:
        out[0] = grad if keep is None else tc.where(keep, grad, 0)
    if grad_input_mask[1] and min_chosen is not None:
        out[1] = tc.where(min_chosen, grad, 0)
    if grad_input_mask[2] and max_chosen is not None:
        out[2] = tc.where(max_chosen, grad, 0)
    return tuple(out)


def clamp_jvp(self_p, self_t, min_p, min_t, max_p, max_t):
    """Forward mode of clamp: the tangent of whichever of self, min, max was chosen
    (Python-number arguments have the tangent 0 and add no term)."""
    keep, min_chosen, max_chosen = _clamp_masks(self_p, min_p, max_p)
    terms = []
    if not _is_number(self_t):
        terms.append(self_t if keep is None else tc.where(keep, self_t, 0))
    if min_chosen is not None and not _is_number(min_t):
        terms.append(tc.where(min_chosen, min_t, 0))
    if max_chosen is not None and not _is_number(max_t):
        terms.append(tc.where(max_chosen, max_t, 0))
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def where_backward(grad, condition, grad_input_mask):
    """where(condition, self, other): the chosen side gets the gradient."""
    return (tc.where(condition, grad, 0) if grad_input_mask[0] else None,
            tc.where(condition, 0, grad) if grad_input_mask[1] else None)


def gelu_backward(grad, self, approximate: str):
    """gelu: exact, Phi(x) + x phi(x); with approximate='tanh', PyTorch's derivative of the
    tanh formula.  (Half tensors reach it widened to float32: backward.py runs an elementwise
    op's derivative formula in float32 and rounds once, as PyTorch's kernel does.)"""
    if approximate == "tanh":
        x_sq = self * self
        inner = GELU_BETA * (self + GELU_KAPPA * x_sq * self)
        t = tc.tanh(inner)
        left_derivative = 0.5 * (1 + t)
        right_derivative = 0.5 * self * (1 - t * t) * GELU_BETA * (1 + 3 * GELU_KAPPA * x_sq)
        return grad * (left_derivative + right_derivative)
    cdf = 0.5 * (1 + tc.erf(self * SQRT1_2))
    pdf = tc.exp(-0.5 * self * self) * INV_SQRT_2PI
    return grad * (cdf + self * pdf)


def silu_backward(grad, self):
    """silu = x sigmoid(x): sigmoid(x) (1 + x (1 - sigmoid(x))); half tensors as gelu's."""
    s = tc.sigmoid(self)
    return grad * s * (1 + self * (1 - s))


# ---------------------------------------------------------------- matmul

def matmul_backward(grad, self, other, grad_input_mask):
    """torch.matmul's backward for every rank combination: 1-D operands are a row (self) or a
    column (other) vector, batch dims broadcast (the engine sums the gradient back to each
    input's shape)."""
    need_self, need_other = grad_input_mask[0], grad_input_mask[1]
    if grad.dtype.is_half and _batch(self) != _batch(other):
        # a broadcast batch dim is summed over by the engine: in float32, rounded once, as
        # PyTorch folds it into its matmul's float32 sum (per-batch half products summed
        # were 0.068 from the float64 truth in bfloat16 where PyTorch's are 3.9e-3)
        grad, self, other = grad.to(tc.float32), self.to(tc.float32), other.to(tc.float32)
    if self.ndim == 1 and other.ndim == 1:                      # dot product, 0-d result
        return (grad * other if need_self else None, grad * self if need_other else None)
    if self.ndim == 1:                                          # (k,) @ (..., k, m) -> (..., m)
        g = grad.unsqueeze(-2)
        return (tc.matmul(g, other.mT).squeeze(-2) if need_self else None,
                tc.matmul(self.unsqueeze(-1), g) if need_other else None)
    if other.ndim == 1:                                         # (..., n, k) @ (k,) -> (..., n)
        g = grad.unsqueeze(-1)
        return (tc.matmul(g, other.unsqueeze(-2)) if need_self else None,
                tc.matmul(self.mT, g).squeeze(-1) if need_other else None)
    return (tc.matmul(grad, other.mT) if need_self else None,
            tc.matmul(self.mT, grad) if need_other else None)


def _batch(t) -> tuple[int, ...]:
    """A matmul operand's batch dims (none for a vector or a matrix)."""
    return tuple(t.shape[:-2])


# ---------------------------------------------------------------- shapes and indexing

def permute_backwards(grad, dims):
    """permute: apply the inverse permutation."""
    n = grad.ndim
    inverse = [0] * n
    for i, d in enumerate(dims):
        inverse[d % n if n else 0] = i
    return grad.permute(inverse)


def cat_backward(grad, tensors, dim: int):
    """cat: each input gets its slice of the gradient along `dim`."""
    from ..ops.rules import cat_kept
    kept = cat_kept([t.shape for t in tensors])
    pieces = iter(tc.split(grad, [tensors[i].shape[dim] for i in kept], dim))
    return [next(pieces) if i in kept else tc.zeros((0,), dtype=grad.dtype) for i in range(len(tensors))]


def split_backward(grads, dim: int):
    """split: concatenate the pieces' gradients (the engine supplies zeros for unused pieces)."""
    return tc.cat(list(grads), dim)


def _normalize_dim(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


def slice_grad(grad, shape: tuple[int, ...], dim: int, start, end, step: int):
    """slice: zeros of the input's shape with the gradient written into the slice
    (`slice_backward` with the bounds normalized the way slice applies them)."""
    d = _normalize_dim(dim, len(shape))
    start, end, _ = slice_bounds(shape[d], start, end, step)       # (a dynamic size too)
    return tc.slice_backward(grad, tuple(shape), d, start, end, step)


def select_grad(grad, shape: tuple[int, ...], dim: int, index: int):
    """select: zeros of the input's shape with the gradient written at `index`."""
    d = _normalize_dim(dim, len(shape))
    return tc.select_backward(grad, tuple(shape), d, wrap_index(index, shape[d]))


def index_select_backward(grad, shape: tuple[int, ...], dim: int, index):
    """index_select: add each selected slice's gradient back at its index (repeats add up)."""
    if len(shape) == 0:
        return grad
    return tc.index_add(tc.zeros(tuple(shape), dtype=grad.dtype), dim, index, grad)


def gather_backward(grad, shape: tuple[int, ...], dim: int, index):
    """gather: scatter-add the gradient back to the gathered positions (repeats add up)."""
    if len(shape) == 0:
        return grad
    return tc.scatter_add(tc.zeros(tuple(shape), dtype=grad.dtype), dim, index, grad)


def pad_to(grad, shape: tuple[int, ...]):
    """`grad` written into the leading corner of zeros of `shape` (each dim at least as large)."""
    for d, (have, want) in enumerate(zip(grad.shape, shape)):
        if have != want:
            target = tuple(grad.shape[:d]) + (want,) + tuple(grad.shape[d + 1:])
            grad = tc.slice_backward(grad, target, d, 0, have, 1)
    return grad


def scatter_add_src_backward(grad, dim: int, index, src):
    """scatter_add: src's gradient is gathered at the index (src may be larger than the index
    in any dim; its elements beyond the index were not used and get zeros)."""
    if grad.ndim == 0:
        return grad if src.ndim == 0 else grad.reshape(src.shape)
    return pad_to(tc.gather(grad, dim, index), tuple(src.shape))


def _used_src(src, index):
    """The part of src that scatter reads: its leading index.shape block."""
    if src.ndim == 0 or tuple(src.shape) == tuple(index.shape):
        return src
    out = src
    for d, n in enumerate(index.shape):
        out = out.narrow(d, 0, n)
    return out


def scatter_prod_backward(grad, self, dim: int, index, src, result, grad_input_mask):
    """scatter_prod: d out / d self is the product of the src elements that landed there;
    d out / d src_j is out / src_j, or, for a zero src_j, self times the other (nonzero)
    src elements at its position when it is the only zero there (else 0).  No division by 0.
    Half tensors: in float32 from the unrounded products, each gradient rounded once."""
    if self.dtype.is_half and grad.dtype is self.dtype:
        wide, wide_src = self.float(), src.float()
        result = tc.scatter_prod(wide, dim, index, _used_src(wide_src, index))
        grads = scatter_prod_backward(grad.float(), wide, dim, index, wide_src, result, grad_input_mask)
        return tuple(None if g is None else g.to(self.dtype) for g in grads)
    used = _used_src(src, index)
    g_self = g_src = None
    if grad_input_mask[0]:
        g_self = grad * tc.scatter_prod(tc.ones_like(self), dim, index, used)
    if grad_input_mask[1]:
        g_src = tc.gather(grad, dim, index) * _scatter_prod_src_factor(self, dim, index, used, result)
        g_src = pad_to(g_src, tuple(src.shape)) if src.ndim else g_src
    return g_self, g_src


def _scatter_prod_src_factor(self, dim: int, index, used, result):
    """d out / d src_j of scatter_prod, gathered at each src element (see below)."""
    zero = used == 0
    others = tc.scatter_prod(self, dim, index, tc.where(zero, 1, used))
    zeros = tc.scatter_add(tc.zeros_like(self), dim, index, zero.to(self.dtype))
    at_zero = tc.gather(tc.where(zeros == 1, others, 0), dim, index)
    return tc.where(zero, at_zero, tc.gather(result, dim, index) / tc.where(zero, 1, used))


def scatter_prod_jvp(self_p, self_t, dim: int, index, src_p, src_t, result):
    """Forward mode of scatter_prod: self_t times the product of what landed, plus each
    src tangent times d out / d src_j, summed at its position."""
    used, used_t = _used_src(src_p, index), _used_src(src_t, index)
    out = self_t * tc.scatter_prod(tc.ones_like(self_p), dim, index, used)
    factor = _scatter_prod_src_factor(self_p, dim, index, used, result)
    return tc.scatter_add(out, dim, index, factor * used_t)


def scatter_extreme_jvp(self_p, self_t, dim: int, index, src_p, src_t, result):
    """Forward mode of scatter_amax/amin: the mean tangent of the elements equal to the result."""
    used, used_t = _used_src(src_p, index), _used_src(src_t, index)
    self_ties = (self_p == result).to(result.dtype)
    src_ties = (used == tc.gather(result, dim, index)).to(result.dtype)
    count = tc.scatter_add(self_ties, dim, index, src_ties)
    return tc.scatter_add(self_t * self_ties, dim, index, used_t * src_ties) / count


def scatter_extreme_backward(grad, self, dim: int, index, src, result, grad_input_mask):
    """scatter_amax/amin: the gradient is shared evenly among the elements equal to the
    result at each position (self's and the src elements that landed there)."""
    used = _used_src(src, index)
    self_ties = (self == result).to(grad.dtype)
    src_ties = (used == tc.gather(result, dim, index)).to(grad.dtype)
    share = grad / tc.scatter_add(self_ties, dim, index, src_ties)
    g_self = share * self_ties if grad_input_mask[0] else None
    g_src = None
    if grad_input_mask[1]:
        g_src = tc.gather(share, dim, index) * src_ties
        g_src = pad_to(g_src, tuple(src.shape)) if src.ndim else g_src
    return g_self, g_src


def index_add_source_backward(grad, dim: int, index, source, alpha):
    """index_add: source's gradient is the output gradient at the index, times alpha."""
    g = grad if grad.ndim == 0 else tc.index_select(grad, dim, index)
    g = g.reshape(source.shape) if tuple(g.shape) != tuple(source.shape) else g
    return g if alpha == 1 else g * alpha


# ---------------------------------------------------------------- attention
# The fused attention op (kind attention in ops.yaml) has a fused backward op; everything
# else about its derivatives comes from its definition in plain ops below, through tc.vjp
# and tc.jvp: forward mode, second derivatives, and the gradients of logsumexp and of a
# float mask, which only a second derivative or a mask that requires grad asks for.

def _attention_scale(query, scale) -> float:
    return 1 / math.sqrt(query.shape[-1]) if scale is None else scale


def _attention_scores(query, key, is_causal: bool, attn_mask, scale):
    scores = tc.matmul(query, key.mT) * _attention_scale(query, scale)
    if is_causal:
        attn_mask = tc.tril(tc.ones([query.shape[-2], key.shape[-2]], dtype=tc.bool))
    if attn_mask is None:
        return scores
    if attn_mask.dtype == tc.bool:
        return tc.masked_fill(scores, tc.logical_not(attn_mask), float("-inf"))
    return scores + attn_mask


def _probabilities(scores, logsumexp):
    """exp(scores - logsumexp), 0 in a row masked throughout (logsumexp -inf)."""
    lse = logsumexp.unsqueeze(-1)
    empty = lse == float("-inf")
    return tc.where(empty, 0.0, tc.exp(scores - tc.where(empty, 0.0, lse)))


def attention_math(query, key, value, is_causal: bool, attn_mask, scale):
    """(output, logsumexp) of the fused attention."""
    scores = _attention_scores(query, key, is_causal, attn_mask, scale)
    lse = tc.logsumexp(scores, -1)
    return tc.matmul(_probabilities(scores, lse), value), lse


def attention_backward_math(grad_out, query, key, value, out, logsumexp, is_causal: bool, attn_mask, scale):
    """The fused backward's (grad_query, grad_key, grad_value): probabilities from logsumexp."""
    p = _probabilities(_attention_scores(query, key, is_causal, attn_mask, scale), logsumexp)
    ds = p * (tc.matmul(grad_out, value.mT) - (grad_out * out).sum(-1, keepdim=True)) * _attention_scale(query, scale)
    return tc.matmul(ds, key), tc.matmul(ds.mT, query), tc.matmul(p.mT, grad_out)


def _float_mask(attn_mask) -> bool:
    return attn_mask is not None and not _is_number(attn_mask) and attn_mask.dtype.is_floating_point


def _with_mask(fn, tensors: list, attn_mask, wants_mask: bool):
    """(fn over `tensors` and the mask, the tensors to differentiate): the mask joins them
    when its gradient is wanted."""
    if wants_mask:
        return (lambda *a: fn(*a[:-1], a[-1])), tensors + [attn_mask]
    return (lambda *a: fn(*a, attn_mask)), tensors


def attention_backward(grads, grads_defined, query, key, value, output, logsumexp, dropout_p, is_causal: bool,
                       attn_mask, scale, grad_input_mask):
    """The fused op's gradients (query, key, value, attn_mask): the fused backward op, unless
    logsumexp has a gradient too or a float mask wants one; then the VJP of attention_math."""
    wants_mask = bool(grad_input_mask[3]) and _float_mask(attn_mask)
    if not grads_defined[1] and not wants_mask:
        dq, dk, dv = tc._scaled_dot_product_flash_attention_for_cpu_backward(
            grads[0], query, key, value, output, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return dq, dk, dv, None
    fn, wrt = _with_mask(lambda q, k, v, m: attention_math(q, k, v, is_causal, m, scale), [query, key, value],
                         attn_mask, wants_mask)
    from .functional import vjp      # (a cycle: formulas -> helpers -> functional -> backward -> formulas)
    found = vjp(fn, *wrt)[1]((grads[0], grads[1]))
    return tuple(found[:3]) + (found[3] if wants_mask else None,)


def attention_double_backward(grads, grad_out, query, key, value, out, logsumexp, is_causal: bool, attn_mask, scale,
                              grad_input_mask):
    """The fused backward's gradients (grad_out, query, key, value, out, logsumexp, attn_mask):
    the VJP of attention_backward_math."""
    wants_mask = bool(grad_input_mask[6]) and _float_mask(attn_mask)
    fn, wrt = _with_mask(lambda g, q, k, v, o, l, m: attention_backward_math(g, q, k, v, o, l, is_causal, m, scale),
                         [grad_out, query, key, value, out, logsumexp], attn_mask, wants_mask)
    from .functional import vjp      # the VJP of the math, as above
    found = vjp(fn, *wrt)[1](tuple(grads))
    return tuple(found[:6]) + (found[6] if wants_mask else None,)


def _mask_tangent(attn_mask, attn_mask_t):
    return _float_mask(attn_mask) and attn_mask_t is not None and not _is_number(attn_mask_t)


def attention_jvp(query_p, query_t, key_p, key_t, value_p, value_t, is_causal: bool, attn_mask, attn_mask_t, scale):
    """Forward mode of the fused op: (the output's tangent, logsumexp's)."""
    wants_mask = _mask_tangent(attn_mask, attn_mask_t)
    fn, primals = _with_mask(lambda q, k, v, m: attention_math(q, k, v, is_causal, m, scale), [query_p, key_p, value_p],
                             attn_mask, wants_mask)
    tangents = [query_t, key_t, value_t] + ([attn_mask_t] if wants_mask else [])
    from .functional import jvp      # the JVP of the math: forward mode runs the engine's own transform
    return tuple(jvp(fn, primals, tangents)[1])


def attention_backward_jvp(grad_out_p, grad_out_t, query_p, query_t, key_p, key_t, value_p, value_t, out_p, out_t,
                           logsumexp_p, logsumexp_t, is_causal: bool, attn_mask, attn_mask_t, scale):
    """Forward mode of the fused backward: the tangents of (grad_query, grad_key, grad_value)."""
    wants_mask = _mask_tangent(attn_mask, attn_mask_t)
    fn, primals = _with_mask(lambda g, q, k, v, o, l, m: attention_backward_math(g, q, k, v, o, l, is_causal, m, scale),
                             [grad_out_p, query_p, key_p, value_p, out_p, logsumexp_p], attn_mask, wants_mask)
    tangents = [grad_out_t, query_t, key_t, value_t, out_t, logsumexp_t] + ([attn_mask_t] if wants_mask else [])
    from .functional import jvp      # the JVP of the math: forward mode runs the engine's own transform
    return tuple(jvp(fn, primals, tangents)[1])


HELPERS: dict[str, Callable[..., Any]] = {
    name: fn for name, fn in list(globals().items())
    if callable(fn) and not name.startswith("_") and getattr(fn, "__module__", None) == __name__
}
