"""tc.nn: PyTorch's `torch.nn` names.  `functional` holds the ops of the table; `Module`,
`Parameter`, the containers and the layers build models from them (module.py, layers.py,
containers.py, attention.py, recurrent.py); `init` initializes parameters."""
from . import functional, init, utils  # noqa: F401
from .module import Module, Parameter  # noqa: F401
from .state import StateDictError  # noqa: F401
from .containers import ModuleDict, ModuleList, Sequential  # noqa: F401
from .layers import (  # noqa: F401
    ELU, GELU, AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Bilinear, Conv1d, Conv2d, ConvTranspose2d,
    Dropout, Embedding, Flatten, GroupNorm, Hardsigmoid, Hardswish, Hardtanh, Identity, LayerNorm, LeakyReLU,
    Linear, LogSoftmax, MaxPool2d, Mish, ReLU, ReLU6, RMSNorm, Sigmoid, SiLU, Softmax, Softplus, Softsign, Tanh)
from .attention import MultiheadAttention, TransformerEncoderLayer  # noqa: F401
from .recurrent import GRU, LSTM, RNN, RNNBase  # noqa: F401
