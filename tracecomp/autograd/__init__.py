"""Automatic differentiation: derivatives.yaml, the eager engine, forward mode, gradcheck.

`tc.autograd.grad` / `tc.autograd.backward` follow PyTorch; `tc.grad`, `tc.value_and_grad`,
`tc.vjp`, `tc.jvp` follow JAX.  All run through the dispatcher, so under tc.trace they
build backward (and tangent) ops into the traced graph.
"""
from .functional import autograd_grad as grad
from .functional import backward
from .node import AccumulateGrad, AutogradError, Edge, Node

__all__ = ["grad", "backward", "Node", "Edge", "AccumulateGrad", "AutogradError"]
