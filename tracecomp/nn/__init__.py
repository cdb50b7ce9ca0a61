"""tc.nn: PyTorch's `torch.nn` names.  `functional` holds the ops of the table; layers
(`Module`, `Linear`, ...) and `tc.optim` come with issue 14."""
from . import functional  # noqa: F401
