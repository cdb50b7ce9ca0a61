"""`tracecomp demo`: its data ships in the package, its three train steps agree, and the
command (run as a user would, as a subprocess) prints its report, writes its pictures and
reaches 95% test accuracy with the default options."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import resources

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.demo import mlp as demo
from tracecomp.demo.plots import Series, line_chart_svg, nice_ticks
from tracecomp.demo.progress import ProgressBar

SVG = "{http://www.w3.org/2000/svg}"


def cli() -> list[str]:
    script = shutil.which("tracecomp", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "tracecomp.cli"]


def run_demo(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli() + ["demo", "--out", str(tmp_path / "out"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_digits_ship_inside_the_package():
    source = resources.files("tracecomp").joinpath("data", "digits.csv.gz")
    assert source.is_file()
    if os.environ.get("TRACECOMP_TEST_INSTALLED"):
        assert "site-packages" in str(source), f"the data was read from the source tree: {source}"
    x, y = demo.model().load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32 and y.dtype == np.int64
    assert x.min() == 0 and x.max() == 1 and np.array_equal(np.unique(y), np.arange(10))
    assert np.bincount(y).min() >= 170          # about 180 images of each digit


def test_split_is_seeded_and_disjoint():
    M = demo.model()
    x, y = np.arange(100, dtype=np.float32)[:, None], np.arange(100)
    a = M.split(x, y, 0.2, seed=3)
    b = M.split(x, y, 0.2, seed=3)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert len(a[0]) == 80 and len(a[2]) == 20
    assert sorted(np.concatenate([a[1], a[3]]).tolist()) == list(range(100))


def test_compiled_eager_and_numpy_steps_agree():
    M = demo.model()
    x, y = M.load_digits()
    params, xb, yb = M.init_params(16, seed=1), x[:24], y[:24]
    reference = M.numpy_step(*[p.astype(np.float64) for p in params], xb.astype(np.float64), yb, 0.05)
    compiled = tc.trace(M.make_step(0.05))(*params, xb, yb)
    eager = M.make_step(0.05)(*[tc.tensor(a) for a in (*params, xb, yb)])
    for got in (compiled, eager):
        assert len(got) == len(reference)
        for g, r in zip(got, reference):
            np.testing.assert_allclose(np.asarray(g, np.float64), r, rtol=1e-5, atol=1e-6)


def test_nice_ticks_cover_the_range_with_round_steps():
    for lo, hi in [(0, 2.31), (0.013, 0.97), (-3, 880), (5, 5)]:
        ticks = nice_ticks(lo, hi)
        assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 12
        steps = np.diff(ticks)
        assert np.allclose(steps, steps[0])
        mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
        assert any(np.isclose(mantissa, m) for m in (1, 2, 5))
    with pytest.raises(ValueError):
        nice_ticks(0, float("inf"))


def test_line_chart_is_valid_svg_with_escaped_text():
    svg = line_chart_svg([Series("a < b & c", [1, 2, 3], [3.0, 1.0, float("nan")])], title="t & <x>")
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    lines = root.findall(SVG + "polyline")
    assert len(lines) == 1 and len(lines[0].get("points").split()) == 2       # the NaN is left out
    assert "a < b & c" in [t.text for t in root.iter(SVG + "text")]
    with pytest.raises(ValueError, match="no finite points"):
        line_chart_svg([Series("empty", [], [])])


def test_progress_bar_prints_about_ten_lines_when_not_a_terminal():
    stream = io.StringIO()
    bar = ProgressBar(1000, label="work ", stream=stream)
    for done in range(1, 1001):
        bar.update(done, f"item {done}")
    lines = stream.getvalue().splitlines()
    assert 10 <= len(lines) <= 11 and "\r" not in stream.getvalue()
    assert lines[-1].startswith("work [" + "#" * 30 + "] 100% 1000/1000") and lines[-1].endswith("item 1000")


def test_progress_bar_redraws_in_place_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stream = Terminal()
    bar = ProgressBar(50, stream=stream, interval=0.0)
    for done in range(1, 51):
        bar.update(done)
    text = stream.getvalue()
    assert text.count("\r") == 50 and text.count("\n") == 1 and text.endswith("\n")
    assert "100% 50/50" in text.split("\r")[-1]


def _check_outputs(tmp_path, proc) -> str:
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in ["data: 1797 images", "compiled train step: first call", "compile stages: trace",
                     "check: compiled step vs NumPy",
                     "tracecomp compiled", "tracecomp eager", "NumPy by hand", "test accuracy:", "wrote "]:
        assert expected in out, f"{expected!r} missing from the demo's output:\n{out}"
    assert len(re.findall(r"\d+ steps/s", out)) == 3
    diff = float(re.search(r"max \|difference\| (\S+)", out).group(1))
    assert diff < 1e-5
    assert "training [" in proc.stderr and "100%" in proc.stderr       # the progress bar
    folder = tmp_path / "out"
    loss = ET.parse(folder / "loss.svg").getroot()
    assert loss.tag == SVG + "svg" and len(loss.findall(SVG + "polyline")) == 2
    dot = (folder / "train_step.dot").read_text()
    assert dot.startswith('digraph "train_step"') and 'subgraph "cluster_0"' in dot and 'class="backward"' in dot
    if shutil.which("dot"):
        graph = ET.parse(folder / "train_step.svg").getroot()
        classes = [g.get("class") for g in graph.iter(SVG + "g")]
        assert "node backward" in classes and "node forward" in classes and "cluster" in classes
    else:
        assert "install Graphviz" in out
    return out


def test_demo_short_run_prints_its_report_and_writes_pictures(tmp_path):
    proc = run_demo(tmp_path, "--epochs", "2", "--hidden", "16", "--batch-size", "64", "--lr", "0.2")
    out = _check_outputs(tmp_path, proc)
    assert "model: 64-16-10 MLP" in out and "batch 64" in out
    assert re.search(r"trained 44 steps", out)        # 2 epochs of 1438 // 64 = 22 steps


def test_demo_full_run_reaches_95_percent(tmp_path):
    proc = run_demo(tmp_path)
    out = _check_outputs(tmp_path, proc)
    accuracy = float(re.search(r"test accuracy: ([\d.]+)%", out).group(1))
    assert accuracy >= 95.0, out


@pytest.mark.parametrize("args, message", [
    (["--epochs", "0"], "--epochs must be at least 1"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--batch-size", "5000"], "larger than the training set"),
])
def test_demo_bad_options_get_one_line_errors(tmp_path, args, message):
    proc = run_demo(tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr
    assert proc.stderr.startswith("tracecomp: error:") and "Traceback" not in proc.stderr


def test_demo_unwritable_output_folder_fails_before_training(tmp_path):
    (tmp_path / "a_file").write_text("")
    proc = subprocess.run(cli() + ["demo", "--out", str(tmp_path / "a_file" / "out")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("tracecomp: error:") and "a_file" in proc.stderr
    assert "training" not in proc.stderr and "test accuracy" not in proc.stdout


def test_demo_without_graphviz_writes_the_dot_file_and_says_how_to_draw_it(tmp_path, monkeypatch):
    M = demo.model()
    x, y = M.load_digits()
    params = M.init_params(8, seed=0)
    lowered = tc.trace(M.make_step(0.1)).lower(*params, x[:16], y[:16])
    monkeypatch.setattr(demo.pictures, "have_graphviz", lambda: False)
    said = []
    options = demo.Options(hidden=8, out=str(tmp_path))
    files = demo.write_pictures(options, lowered, [2.0, 1.5, 1.0, 0.8], 2, 0.5, said.append)
    assert [os.path.basename(f) for f in files] == ["loss.svg", "train_step.dot"]
    assert not (tmp_path / "train_step.svg").exists()
    assert "install Graphviz" in said[-1] and "apt-get install graphviz" in said[-1] and "dot -Tsvg" in said[-1]
    ET.parse(tmp_path / "loss.svg")
