"""`tracecomp demo cnn` and `tracecomp demo gpt`: the CNN's train step compiles once and
agrees with the same step run eagerly, short runs of both demos (as a user runs them, a
subprocess) print their reports, learn and write loss.svg, and Hamlet ships in the package."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np

import tracecomp as tc
from tracecomp.demo import cnn as demo_cnn, gpt as demo_gpt

SVG = "{http://www.w3.org/2000/svg}"


def cli() -> list[str]:
    script = shutil.which("tracecomp", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "tracecomp.cli"]


def run_cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli() + ["demo", *args, "--out", str(tmp_path / "out")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1).replace(",", ""))


def test_cnn_step_compiles_once_and_matches_the_eager_step():
    o = demo_cnn.Options(epochs=2, seed=3)
    x_train, y_train, x_test, y_test = demo_cnn.load_images(o.seed)
    assert x_train.shape == (1438, 1, 8, 8) and x_test.shape == (359, 1, 8, 8)
    model = demo_cnn.build_model(o.seed)
    opt = demo_cnn.make_optimizer(o)
    train_step = demo_cnn.make_train_step(opt)
    step = tc.trace(train_step, donate_argnums=(0, 1))
    rng = np.random.default_rng(0)
    total = o.epochs * (len(x_train) // o.batch_size)
    said = []
    model, state, loss, _, diff = demo_cnn.compile_and_check(
        step, train_step, model, opt.init(model), x_train[:32], y_train[:32], demo_cnn.cosine_lr(o.lr, 0, total),
        said.append)
    assert diff < 1e-12 and "compiled vs run eagerly (float64)" in said[-1]
    model, state, losses, _ = demo_cnn.train(o, step, model, state, x_train, y_train, rng, [loss], total)
    assert len(losses) == total and len(step._cache) == 1          # the moving lr is data: no retrace
    assert np.mean(losses[-10:]) < 0.5 < losses[0]
    model.eval()
    accuracy = np.mean(np.asarray(tc.trace(demo_cnn.predict)(model, x_test)) == y_test)
    assert accuracy > 0.85


def test_cnn_demo_short_run_via_the_cli(tmp_path):
    proc = run_cli(tmp_path, "cnn", "--epochs", "2", "--batch-size", "64", "--lr", "0.005")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in ["data: 1797 images of 1x8x8", "1438 to train on, 359 held out", "Conv2d(1->16, 3x3, pad 1)",
                     "MaxPool2d(2)", "compiled train step", "steps/s", "eager step", "test accuracy:", "wrote "]:
        assert expected in out, f"{expected!r} missing from the demo's output:\n{out}"
    assert "trained 44 steps" in out                     # 2 epochs of 1438 // 64 = 22 steps
    assert number(r"max \|difference\| .* (\S+)\n", out) < 1e-12
    assert number(r"test accuracy: ([\d.]+)%", out) > 80
    assert "training [" in proc.stderr and "100%" in proc.stderr
    chart = ET.parse(tmp_path / "out" / "loss.svg").getroot()
    assert chart.tag == SVG + "svg" and len(chart.findall(SVG + "polyline")) == 2


def test_hamlet_ships_inside_the_package_as_plain_text():
    text = demo_gpt.load_text()
    assert len(text) == 177_488 and text.isascii() and text.startswith("Hamlet\n\nACT I\n")
    vocab = demo_gpt.Vocabulary(text)
    assert len(vocab) == 64 and vocab.decode(vocab.encode("HAMLET:\nTo be")) == "HAMLET:\nTo be"
    assert "HAMLET:\nTo be, or not to be: that is the question:" in text
    assert not re.search(r"[*_#\\]", text)            # no Markdown left
    baseline = demo_gpt.unigram_baseline(vocab.encode(text), len(vocab))
    assert 3.0 < baseline < np.log(64)


def test_gpt_demo_tiny_run_via_the_cli(tmp_path):
    proc = run_cli(tmp_path, "gpt", "--steps", "60", "--layers", "1", "--dim", "32", "--heads", "2",
                   "--context", "16", "--batch-size", "16", "--lr", "0.01", "--sample-length", "40",
                   "--prompt", "HORATIO:\\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in ["data: Hamlet, 177,488 characters", "vocabulary of 64 characters", "unigram baseline:",
                     "1 pre-norm Transformer block ", "compiled train step", "trained 60 steps", "validation loss:",
                     "sample (temperature 0.8", "  | HORATIO:\n  | ", "wrote "]:
        assert expected in out, f"{expected!r} missing from the demo's output:\n{out}"
    first = number(r"first call [\d.]+ s(?: \(machine code from the compile cache\))?, loss ([\d.]+)", out)
    last = number(r"mean training loss of the last \d+ steps ([\d.]+)", out)
    baseline = number(r"unigram baseline: ([\d.]+)", out)
    val = number(r"validation loss: ([\d.]+)", out)
    assert last < first - 0.5 and val < baseline, out
    assert "training [" in proc.stderr and "100%" in proc.stderr
    chart = ET.parse(tmp_path / "out" / "loss.svg").getroot()
    assert len(chart.findall(SVG + "polyline")) == 3


def test_gpt_generation_reads_the_last_real_position():
    """While the text is shorter than the window, the padding after it must not matter."""
    vocab = demo_gpt.Vocabulary("abc\n")
    seen = []

    def logits_fn(window):                  # always predicts "the character after the last one"
        seen.append(window.copy())
        out = np.full((1, window.shape[1], len(vocab)), -10.0)
        out[0, np.arange(window.shape[1]), (window[0] + 1) % len(vocab)] = 10.0
        return out
    text = demo_gpt.generate(logits_fn, vocab, "a", 5, context=4, temperature=0.0, rng=np.random.default_rng(0))
    assert text == "abc\nab" and all(w.shape == (1, 4) for w in seen)


def test_bad_gpt_options_get_one_line_errors(tmp_path):
    proc = run_cli(tmp_path, "gpt", "--dim", "30", "--heads", "4")
    assert proc.returncode == 2 and proc.stderr.startswith("tracecomp: error:") and "--heads" in proc.stderr


def test_gpt_demo_trains_data_parallel_on_a_local_dask_cluster_as_in_one_process(tmp_path):
    """`tracecomp demo gpt --dask`: two workers of a LocalCluster, each on half of every batch,
    end where one process does."""
    import pytest
    pytest.importorskip("distributed", reason="Dask is an optional extra: pip install 'tracecomp[dask]'")
    tiny = dict(steps=12, layers=1, dim=16, heads=2, context=16, batch_size=8, sample_length=5)
    alone = demo_gpt.run(demo_gpt.Options(**tiny, out=str(tmp_path / "alone")), say=lambda line: None)
    lines = []
    spread = demo_gpt.run(demo_gpt.Options(**tiny, out=str(tmp_path / "dask"), dask="local"), say=lines.append)
    assert any(line.startswith("dask: data-parallel over 2 workers") for line in lines)
    np.testing.assert_allclose(spread.losses, alone.losses, rtol=1e-4)
    assert abs(spread.val_loss - alone.val_loss) < 1e-4
