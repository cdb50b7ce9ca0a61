"""torch.nn.functional's names for ops of ops.yaml: `tc.nn.functional.relu(x)` is
`tc.relu(x)`.  It holds every op whose PyTorch name (its `torch:` key) is
`nn.functional.<name>`, under that name (`unfold` is `tc.im2col`), and the ops PyTorch
offers under both `torch.<name>` and `torch.nn.functional.<name>`, listed in ALSO.
Nothing here is a second implementation."""
from __future__ import annotations

from ..dispatch import api
from ..ops.table import default_table

ALSO = ("relu", "sigmoid", "tanh", "softmax", "log_softmax")


def _ops() -> dict[str, str]:
    """torch.nn.functional's name -> the tc function."""
    prefix = "nn.functional."
    ops = {op.torch[len(prefix):]: op.name for op in default_table().values() if op.torch.startswith(prefix)}
    return dict(sorted({**ops, **{name: name for name in ALSO}}.items()))


_OPS = _ops()
__all__ = list(_OPS)
globals().update({name: getattr(api, op) for name, op in _OPS.items()})
