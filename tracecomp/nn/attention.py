"""MultiheadAttention and TransformerEncoderLayer, with PyTorch's parameter names (so their
state dicts load across), arguments and mask conventions.  Without attention weights to
return, attention is one scaled_dot_product_attention (the fused kernel)."""
from __future__ import annotations

from ..core.errors import ArgumentError, ShapeError
from . import functional as F, init
from .layers import Dropout, LayerNorm, Linear, empty_parameter
from .module import Module, Parameter
from ..dispatch import api as tc


def _sdpa_mask(attn_mask, key_padding_mask, n: int, heads: int, L: int, S: int, dtype):
    """PyTorch MHA's masks (bool: True means *not* allowed; float: added) as one mask for
    scaled_dot_product_attention (bool: True means allowed), shaped to broadcast against
    the scores (N, H, L, S); None when there is none."""

    def additive(m):
        if m.dtype == tc.bool:
            return tc.zeros(m.shape, dtype=dtype).masked_fill(m, float("-inf"))
        return m.to(dtype)
    mask = None
    if attn_mask is not None:
        if attn_mask.ndim == 3:                    # (N * H, L, S)
            if tuple(attn_mask.shape) != (n * heads, L, S):
                raise ShapeError(f"MultiheadAttention: a 3-D attn_mask must have shape {(n * heads, L, S)}, "
                                 f"got {tuple(attn_mask.shape)}")
            attn_mask = attn_mask.reshape(n, heads, L, S)
        elif tuple(attn_mask.shape) != (L, S):
            raise ShapeError(f"MultiheadAttention: a 2-D attn_mask must have shape {(L, S)}, got "
                             f"{tuple(attn_mask.shape)}")
        mask = attn_mask
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (n, S):
            raise ShapeError(f"MultiheadAttention: key_padding_mask must have shape {(n, S)}, got "
                             f"{tuple(key_padding_mask.shape)}")
        kp = key_padding_mask.reshape(n, 1, 1, S)
        if mask is None:
            mask = kp
        elif mask.dtype == tc.bool and kp.dtype == tc.bool:
            mask = mask | kp
        else:
            mask = additive(mask) + additive(kp)
    if mask is None:
        return None
    return ~mask if mask.dtype == tc.bool else mask.to(dtype)


class MultiheadAttention(Module):
    """PyTorch's arguments in PyTorch's order; keys and values of other sizes (kdim, vdim) get
    their own projections (q/k/v_proj_weight, as PyTorch names them)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ArgumentError(f"MultiheadAttention: embed_dim ({embed_dim}) must divide by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise ArgumentError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim = embed_dim // num_heads
        self.same_dims = self.kdim == embed_dim and self.vdim == embed_dim
        separate = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
        if self.same_dims:
            self.in_proj_weight = empty_parameter(3 * embed_dim, embed_dim, dtype=dtype)
            for name in separate:
                self.register_parameter(name, None)
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for name, width in zip(separate, (embed_dim, self.kdim, self.vdim)):
                setattr(self, name, empty_parameter(embed_dim, width, dtype=dtype))
                init.xavier_uniform_(getattr(self, name))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(tc.zeros(3 * embed_dim, dtype=dtype or tc.float32))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _projection(self, i: int):
        """The weight that projects the query (0), key (1) or value (2)."""
        E = self.embed_dim
        if self.same_dims:
            return self.in_proj_weight[i * E:(i + 1) * E]
        return (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if not self.batch_first or unbatched:          # (L, N, E) -> (N, L, E)
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        n, L, E = query.shape
        S = key.shape[1]
        if E != self.embed_dim:
            raise ShapeError(f"MultiheadAttention: the query's embedding size is {E}, expected {self.embed_dim}")
        b = self.in_proj_bias
        bias = (lambda i: None) if b is None else (lambda i: b[i * E:(i + 1) * E])
        heads = [F.linear(x, self._projection(i), bias(i)).reshape(n, -1, self.num_heads, self.head_dim)
                 .transpose(1, 2) for i, x in enumerate((query, key, value))]
        mask = _sdpa_mask(attn_mask, key_padding_mask, n, self.num_heads, L, S, query.dtype)
        causal = is_causal and mask is None
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:                               # the weights are a result: compute them
            q, k, v = heads
            scores = (q @ k.transpose(-2, -1)) * (self.head_dim ** -0.5)
            if causal:
                scores = scores.masked_fill(~tc.ones((L, S), dtype=tc.bool).tril(), float("-inf"))
            elif mask is not None:
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == tc.bool else scores + mask
            weights = F.dropout(F.softmax(scores, -1), p, self.training)
            out = weights @ v
            weights = weights.mean(1) if average_attn_weights else weights
            if unbatched:
                weights = weights.squeeze(0)
        else:
            out = F.scaled_dot_product_attention(*heads, attn_mask=mask, dropout_p=p, is_causal=causal)
        out = self.out_proj(out.transpose(1, 2).reshape(n, L, E))
        if not self.batch_first or unbatched:
            out = out.transpose(0, 1)
        return (out.squeeze(1) if unbatched else out), weights


class TransformerEncoderLayer(Module):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            if activation not in ("relu", "gelu"):
                raise ArgumentError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a "
                                    f"callable, got {activation!r}")
            activation = getattr(F, activation)
        self.activation = activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._attend(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._attend(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._feed_forward(x))

    def _attend(self, x, mask, padding, is_causal):
        out = self.self_attn(x, x, x, key_padding_mask=padding, need_weights=False, attn_mask=mask,
                             is_causal=is_causal)[0]
        return self.dropout1(out)

    def _feed_forward(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
