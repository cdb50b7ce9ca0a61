"""tc.nn.functional holds exactly the table's ops that torch.nn.functional has, by
torch.nn.functional's names, and they are the same functions as the table's tc.<name>."""
from __future__ import annotations

import pytest

import tracecomp as tc
from tracecomp.ops.table import default_table

F = pytest.importorskip("torch.nn.functional", reason="torch not installed (the test-only oracle)")


def test_every_shared_name_is_there_and_nothing_else():
    prefix = "nn.functional."
    names = {op.torch[len(prefix):] if op.torch.startswith(prefix) else op.name: op.name
             for op in default_table().values() if "function" in op.variants}
    shared = sorted(n for n in names if hasattr(F, n))
    assert sorted(tc.nn.functional.__all__) == shared, (
        "give an op that torch.nn.functional has the key `torch: nn.functional.<name>` in ops.yaml, "
        "or list it in tracecomp/nn/functional.py's ALSO when PyTorch also has torch.<name>")
    for name in shared:
        assert getattr(tc.nn.functional, name) is getattr(tc, names[name])
