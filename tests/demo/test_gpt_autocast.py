"""`tracecomp demo gpt --autocast bf16`, short: the loss curve under tc.autocast(bfloat16)
follows the float32 one (the long run, 500 steps, is in BENCHMARKS.md), and the option's
mistakes are named."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.demo import gpt as demo_gpt

STEPS = 40


def _run(tmp_path, autocast: str) -> demo_gpt.Result:
    o = demo_gpt.Options(steps=STEPS, layers=1, dim=32, heads=2, context=16, batch_size=16, lr=0.01,
                         sample_length=0, out=str(tmp_path / (autocast or "f32")), autocast=autocast)
    return demo_gpt.run(o, say=lambda line: None)


def test_bf16_autocast_loss_curve_follows_float32(tmp_path):
    f32, bf16 = _run(tmp_path, ""), _run(tmp_path, "bf16")
    assert len(f32.losses) == len(bf16.losses) == STEPS
    tail = slice(-10, None)
    assert np.mean(f32.losses[tail]) < f32.losses[0] - 0.5          # it learns
    np.testing.assert_allclose(np.mean(bf16.losses[tail]), np.mean(f32.losses[tail]), rtol=0.03)
    np.testing.assert_allclose(bf16.val_loss, f32.val_loss, rtol=0.03)
    assert not tc.is_autocast_enabled()                             # the demo's block ended


def test_autocast_option_is_checked():
    p = argparse.ArgumentParser()
    demo_gpt.add_arguments(p)
    assert demo_gpt.options_from(p.parse_args(["--autocast", "bf16"])).autocast == "bf16"
    with pytest.raises(SystemExit):
        p.parse_args(["--autocast", "fp8"])
    with pytest.raises(tc.ArgumentError, match="--autocast .* --dask"):
        demo_gpt.options_from(p.parse_args(["--autocast", "bf16", "--dask"]))
