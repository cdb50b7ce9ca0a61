"""tracecomp.torch.lower(model, *inputs): the graphs tracecomp imports from a PyTorch model,
as the `Lowered` objects that tc.trace(...).lower(...) gives, for dumps (`tracecomp dump
--torch`) and for reading them in Python (`.as_text(stage)`)."""
from __future__ import annotations

from dataclasses import dataclass

from torch._dynamo.exc import BackendCompilerFailed, Unsupported

from ..core.errors import ArgumentError, TracecompError
from ..transforms.stages import Lowered
from .explain import run_once


@dataclass
class TorchLowered:
    """A model's imported graphs: `forward` (the inference graph where nothing needs
    gradients) and `backward` (None where there is none), each a tc.trace `Lowered`."""
    forward: Lowered
    backward: Lowered | None

    @property
    def graphs(self) -> dict[str, Lowered]:
        """The graphs there are, by kind: "forward", then "backward"."""
        return {k: v for k, v in (("forward", self.forward), ("backward", self.backward)) if v is not None}


def lower(model, *inputs, **kwargs) -> TorchLowered:
    """Run `model(*inputs, **kwargs)` once through the backend (and its backward, where an
    output needs gradients: .grad stays as it is) and return the graphs tracecomp compiled.
    The whole model must be one graph that tracecomp compiles whole: a graph break or an op
    that would run in PyTorch raises (tracecomp.torch.explain lists those)."""
    found: dict[str, Lowered] = {}

    def keep(report, lowered: Lowered) -> None:
        found.setdefault("forward" if report.kind == "inference" else report.kind, lowered)

    try:
        run_once(model, inputs, kwargs, {"strict": True, "lowered": keep}, fullgraph=True, dynamic=False)
    except BackendCompilerFailed as e:            # Dynamo's wrapper around the backend's own error
        if isinstance(e.inner_exception, TracecompError):
            raise e.inner_exception from None
        raise
    except Unsupported as e:
        raise ArgumentError(f"tracecomp.torch.lower: {type(model).__name__} is not one graph (a graph break: "
                            f"{str(e).splitlines()[0]}); torch._dynamo.explain shows where") from None
    if "forward" not in found:
        raise ArgumentError(f"tracecomp.torch.lower: {type(model).__name__} gave tracecomp no graph to "
                            "compile (no tensor op on its inputs)")
    return TorchLowered(found["forward"], found.get("backward"))
