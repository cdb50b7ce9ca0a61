"""torch.nn.functional's names for ops of ops.yaml: `tc.nn.functional.relu(x)` is
`tc.relu(x)`.  It holds every op whose PyTorch name (its `torch:` key) is
`nn.functional.<name>`, and the ops PyTorch offers under both `torch.<name>` and
`torch.nn.functional.<name>`, listed in ALSO.  Nothing here is a second implementation."""
from __future__ import annotations

import tracecomp as _tc
from ..ops.table import default_table

ALSO = ("relu", "sigmoid", "tanh", "softmax", "log_softmax")


def _names() -> list[str]:
    table = default_table().values()
    return sorted({op.name for op in table if (op.torch).startswith("nn.functional.")} | set(ALSO))


__all__ = _names()
globals().update({name: getattr(_tc, name) for name in __all__})
