"""The errors a new user met first (issue 17), verbatim as they read now: each names the
argument's path in the pytree, its Python type, the user's line, and what to write
instead.  A change to one of these texts is a decision, so the whole text is pinned."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch")
X = np.ones((2, 3), np.float32)
HERE = os.path.relpath(__file__)


def loss(p):
    return p["w"].sum() if isinstance(p, dict) else p[0].sum()


# (what the user did, the call on one line, the error class, its text; "@" is the call's line)
CASES = [
    ("grad over a dict that holds a name",
     lambda: tc.grad(loss)({"w": X, "name": "encoder"}), tc.ArgumentError,
     "argument 0['name'] is a str ('encoder'), not a tensor: a differentiated argument holds tensors "
     "only (pass other values in arguments that argnums does not select)\n  at @"),
    ("grad over a list with integer labels",
     lambda: tc.grad(loss)([X, np.arange(3)]), tc.ArgumentError,
     "argument 0[1] is a numpy.ndarray of dtype int64, but only floating-point inputs can be "
     "differentiated: cast it (x.astype(np.float32), t.float()), or pass it in an argument that "
     "argnums does not select\n  at @"),
    ("grad over a dict with a step count",
     lambda: tc.grad(loss)({"w": X, "steps": 3}), tc.ArgumentError,
     "argument 0['steps'] is the Python int 3, but only floating-point inputs can be differentiated: "
     "cast it (x.astype(np.float32), t.float()), or pass it in an argument that argnums does not "
     "select\n  at @"),
    ("a tracecomp tensor plus a torch tensor",
     lambda: tc.tensor(X) + torch.ones(2, 3), tc.ArgumentError,
     "add: the operands are a tracecomp.Tensor and a torch.Tensor; convert one first: "
     "tc.from_dlpack(t) gives a tracecomp.Tensor sharing its memory, torch.from_dlpack(x) a "
     "torch.Tensor\n  at @"),
    ("a torch tensor that requires grad passed to a compiled function",
     lambda: tc.trace(lambda a: a * 2)(torch.ones(3, requires_grad=True)), tc.ArgumentError,
     "a torch.Tensor that requires grad cannot be shared with tracecomp (its gradient would be "
     "lost): pass x.detach(), or compute the gradient with tracecomp\n  at @"),
    ("an operator tracecomp lacks",
     lambda: tc.cholesky_inverse, AttributeError,
     "module 'tracecomp' has no attribute 'cholesky_inverse'; PyTorch has torch.cholesky_inverse, "
     "tracecomp does not (yet). The supported operators: `tracecomp ops` (or README.md, 'Supported "
     "operators')"),
    ("vmap over a Python number",
     lambda: tc.vmap(lambda a, b: a * b)(X, 2.0), tc.VmapError,
     "tc.vmap: args[1] is a float (2.0), not an array, so it cannot be mapped over axis 0; give it "
     "None in in_axes\n  at @"),
    ("vmap over inputs of different batch sizes",
     lambda: tc.vmap(lambda a, b: a * b)(X, np.ones((3, 3), np.float32)), tc.VmapError,
     "tc.vmap(<lambda>): the mapped axes have different sizes: args[0] has 2 along its mapped axis, "
     "args[1] has 3 (axis 0 of shape (3, 3))\n  at @"),
    ("a random op inside vmap",
     lambda: tc.vmap(lambda a: a + tc.rand(3))(X), tc.VmapError,
     "rand: a random op inside tc.vmap(randomness='error') (the default); pass "
     "randomness='different' for independent values per batch item or 'same' for one draw shared "
     "by all\n  at @"),
]


@pytest.mark.parametrize("what, call, error, text", CASES, ids=[c[0] for c in CASES])
def test_error_text(what, call, error, text):
    with pytest.raises(error) as e:
        call()
    line = call.__code__.co_firstlineno
    assert str(e.value).strip("'\"") == text.replace("@", f"{HERE}:{line}")
