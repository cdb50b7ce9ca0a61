"""RNN, LSTM and GRU with PyTorch's constructor arguments, parameter names and shapes, gate
order (LSTM i, f, g, o; GRU r, z, n), initialization and forward signature, so that a
torch.nn state dict loads and gives the same outputs.

Each layer and direction is one tc.scan: the input projection of every step is one matmul
over the whole sequence before the loop, and the loop body does only the recurrent part
(h @ W_hh^T and the gates).  Under tc.trace that is one loop op whatever the sequence
length; eagerly it is a Python loop over the steps.  The backward direction is a second
scan with reverse=True, whose outputs line up with the input's steps, so the two
directions' outputs concatenate on the feature dim as PyTorch's do.  Dropout between
layers (training only) acts on a whole layer's output, outside the loops.
"""
from __future__ import annotations

import math
import numbers
import warnings

from ..control.functions import scan
from ..core.errors import ArgumentError, DTypeError, ShapeError, TracecompError
from ..tensors.tensor import as_tensor
from . import functional as F, init
from .layers import empty_parameter
from .module import Module
from ..dispatch import api as tc


class NotSupportedError(TracecompError, NotImplementedError):
    """A PyTorch option that tracecomp's recurrent layers do not implement."""


def _positive(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentError(f"{what} must be a positive int, got {value!r}")


# the number of gate blocks stacked in each weight's rows
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class RNNBase(Module):
    """What RNN, LSTM and GRU share: the parameters of every layer and direction (PyTorch's
    names, in PyTorch's order, so state dicts match key for key) and the layer loop."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None):
        super().__init__()
        name = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(mode, mode)
        _positive(input_size, f"{name}: input_size")
        _positive(hidden_size, f"{name}: hidden_size")
        _positive(num_layers, f"{name}: num_layers")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1:
            raise ArgumentError(f"{name}: dropout should be a number in range [0, 1] representing the "
                                f"probability of an element being zeroed, got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", stacklevel=3)
        if isinstance(proj_size, bool) or not isinstance(proj_size, int) or proj_size < 0:
            raise ArgumentError(f"{name}: proj_size must be an int >= 0, got {proj_size!r}")
        if proj_size:
            if mode != "LSTM":
                raise ArgumentError(f"{name}: proj_size is only supported for LSTM, not RNN or GRU")
            raise NotSupportedError("LSTM: proj_size (an LSTM with projections) is not supported by tracecomp; "
                                    "use proj_size=0 and a tc.nn.Linear on the output")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional, self.proj_size = bool(bidirectional), 0
        directions = 2 if bidirectional else 1
        rows = _GATES[mode] * hidden_size
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                setattr(self, f"weight_ih_l{layer}{suffix}", empty_parameter(rows, width, dtype=dtype))
                setattr(self, f"weight_hh_l{layer}{suffix}", empty_parameter(rows, hidden_size, dtype=dtype))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}", empty_parameter(rows, dtype=dtype))
                    setattr(self, f"bias_hh_l{layer}{suffix}", empty_parameter(rows, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """PyTorch's cuDNN weight packing; nothing to do here (kept so that code calling it runs)."""

    @property
    def _directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _weights(self, layer: int, direction: int) -> tuple:
        suffix = "_reverse" if direction else ""
        get = lambda kind: self._parameters.get(f"{kind}_l{layer}{suffix}")    # noqa: E731
        return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh")

    @property
    def all_weights(self) -> list:
        """The parameters by layer and direction, each [w_ih, w_hh, b_ih, b_hh] (PyTorch's)."""
        return [[w for w in self._weights(layer, d) if w is not None]
                for layer in range(self.num_layers) for d in range(self._directions)]

    # ------------------------------------------------------------ forward
    def _state_shape(self, batch: int | None) -> tuple:
        rows = self.num_layers * self._directions
        return (rows, self.hidden_size) if batch is None else (rows, batch, self.hidden_size)

    def _check_state(self, h, batch: int | None, what: str, dtype):
        h = as_tensor(h)
        if batch is None and h.ndim != 2:
            raise ShapeError(f"{self._name}: for an unbatched 2-D input, {what} should also be 2-D, "
                             f"got a {h.ndim}-D tensor")
        if batch is not None and h.ndim != 3:
            raise ShapeError(f"{self._name}: for a batched 3-D input, {what} should also be 3-D, "
                             f"got a {h.ndim}-D tensor")
        want = self._state_shape(batch)
        if tuple(h.shape) != want:
            raise ShapeError(f"{self._name}: expected {what} of size {want}, got {tuple(h.shape)}")
        if h.dtype != dtype:
            raise DTypeError(f"{self._name}: {what} has dtype {h.dtype} but the input has {dtype}")
        return h if batch is not None else h.unsqueeze(1)

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _initial(self, hx, batch: int | None, n: int, dtype) -> list:
        """Per layer and direction, the initial carry of the scan: h (N, H), or (h, c) for LSTM."""
        count = self.num_layers * self._directions
        if hx is None:
            zeros = lambda: tc.zeros((n, self.hidden_size), dtype=dtype)     # noqa: E731
            return [(zeros(), zeros()) if self.mode == "LSTM" else zeros() for _ in range(count)]
        if self.mode == "LSTM":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise ArgumentError(f"LSTM: hx must be a pair (h_0, c_0), got {type(hx).__name__}")
            h0 = tc.unbind(self._check_state(hx[0], batch, "h_0", dtype), 0)
            c0 = tc.unbind(self._check_state(hx[1], batch, "c_0", dtype), 0)
            return list(zip(h0, c0))
        if isinstance(hx, (tuple, list)):
            raise ArgumentError(f"{self._name}: hx must be a tensor h_0, got a {type(hx).__name__}")
        return list(tc.unbind(self._check_state(hx, batch, "h_0", dtype), 0))

    def forward(self, input, hx=None):
        """input (L, N, H_in), (N, L, H_in) with batch_first, or unbatched (L, H_in); returns
        (output, h_n), for LSTM (output, (h_n, c_n)), in PyTorch's shapes: output (L, N, D * H)
        (batch_first: (N, L, D * H)), h_n and c_n (num_layers * D, N, H); unbatched without N."""
        x = as_tensor(input)
        if x.ndim not in (2, 3):
            raise ShapeError(f"{self._name}: expected a 2-D (unbatched) or 3-D (batched) input, "
                             f"got shape {tuple(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise ShapeError(f"{self._name}: input.size(-1) must be equal to input_size. Expected "
                             f"{self.input_size}, got {x.shape[-1]}")
        dtype = self.weight_ih_l0.dtype
        if x.dtype != dtype:
            raise DTypeError(f"{self._name}: input dtype ({x.dtype}) does not match weight dtype ({dtype}). "
                             f"Convert the input: input.to({dtype}), or the model: model.to({x.dtype})")
        batched = x.ndim == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[0] == 0:
            raise ShapeError(f"{self._name}: expected a sequence length larger than 0")
        carries = self._initial(hx, x.shape[1] if batched else None, x.shape[1], dtype)
        finals = []
        for layer in range(self.num_layers):
            outs = []
            for d in range(self._directions):
                last, ys = self._direction(x, carries[layer * self._directions + d], layer, d)
                finals.append(last)
                outs.append(ys)
            x = outs[0] if len(outs) == 1 else tc.cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        if self.mode == "LSTM":
            state = (_stack([h for h, _ in finals]), _stack([c for _, c in finals]))
        else:
            state = _stack(finals)
        if not batched:
            x = x.squeeze(1)
            state = tuple(s.squeeze(1) for s in state) if self.mode == "LSTM" else state.squeeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, state

    def _direction(self, x, carry, layer: int, direction: int):
        """One layer in one direction over x (L, N, in): (last carry, outputs (L, N, H))."""
        w_ih, w_hh, b_ih, b_hh = self._weights(layer, direction)
        gru = self.mode == "GRU"
        # GRU's b_hn sits inside r * (W_hn h + b_hn), so its b_hh stays in the loop; the other
        # cells only ever add b_ih + b_hh, which folds into the projection of all steps
        bias = b_ih if gru or b_ih is None else b_ih + b_hh
        projected = F.linear(x, w_ih, bias)               # every step's x @ W_ih^T + b, one matmul
        w_hh_t = w_hh.t()                                  # transposed once, outside the loop
        step = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN_TANH": _rnn_step, "RNN_RELU": _rnn_step}[self.mode]
        body = step(w_hh_t, b_hh if gru else None, tc.relu if self.mode == "RNN_RELU" else tc.tanh)
        return scan(body, carry, projected, reverse=bool(direction))

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


def _stack(states: list):
    """The final states of every layer and direction, stacked on a new dim 0."""
    return states[0].unsqueeze(0) if len(states) == 1 else tc.stack(states, 0)


# ---------------------------------------------------------------- the cells: scan bodies
# Each takes the carry and the step's projected input xp = x_t @ W_ih^T + b (N, gates * H).

def _rnn_step(w_hh_t, _b_hh, act):
    def step(h, xp):
        h = act(xp + h @ w_hh_t)
        return h, h
    return step


def _lstm_step(w_hh_t, _b_hh, _act):
    def step(carry, xp):
        h, c = carry
        i, f, g, o = tc.chunk(xp + h @ w_hh_t, 4, -1)
        c = tc.sigmoid(f) * c + tc.sigmoid(i) * tc.tanh(g)
        h = tc.sigmoid(o) * tc.tanh(c)
        return (h, c), h
    return step


def _gru_step(w_hh_t, b_hh, _act):
    def step(h, xp):
        hp = h @ w_hh_t if b_hh is None else h @ w_hh_t + b_hh
        x_r, x_z, x_n = tc.chunk(xp, 3, -1)
        h_r, h_z, h_n = tc.chunk(hp, 3, -1)
        r = tc.sigmoid(x_r + h_r)
        z = tc.sigmoid(x_z + h_z)
        n = tc.tanh(x_n + r * h_n)
        h = n + z * (h - n)                                # (1 - z) * n + z * h
        return h, h
    return step


# ---------------------------------------------------------------- the layers

class RNN(RNNBase):
    """Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ArgumentError(f"RNN: unknown nonlinearity {nonlinearity!r}. Select from 'tanh' or 'relu'.")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size,
                         num_layers, bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Long short-term memory; gates i, f, g, o stacked in that order in each weight's rows."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)


class GRU(RNNBase):
    """Gated recurrent unit; gates r, z, n, with PyTorch's n = tanh(W_in x + b_in + r * (W_hn h + b_hn))."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype)
