"""The `tracecomp dump` and `tracecomp export` commands, run as a user would: as subprocesses."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt

MODEL = textwrap.dedent('''
    import tracecomp as tc

    def loss(w, x, idx):
        return (tc.index_select(x, 0, idx) @ w).tanh().sum()

    NOT_A_FUNCTION = 3
''')
INPUTS = ["--input", "f32[8,3]", "--input", "f32[5,8]", "--input", "i64[4]"]


def cli() -> list[str]:
    script = shutil.which("tracecomp", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "tracecomp.cli"]


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "mymodel.py").write_text(MODEL)
    return tmp_path


def run(workdir, *args, ok=True):
    proc = subprocess.run(cli() + list(args), cwd=workdir, capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_dump_text_stages(workdir):
    out = run(workdir, "dump", "mymodel:loss", *INPUTS, "--stage", "optimized").stdout
    assert out.startswith("func.func @loss(") and "tc.index_select" in out
    grad = run(workdir, "dump", "mymodel.py:loss", *INPUTS, "--grad", "0", "--stage", "backward").stdout
    assert "func.func" in grad
    asm = run(workdir, "dump", "mymodel:loss", *INPUTS, "--stage", "asm").stdout
    assert "ret" in asm
    llvm = run(workdir, "dump", "mymodel:loss", *INPUTS, "--stage", "llvm").stdout
    assert "define" in llvm


@pytest.mark.skipif(find_mlir_opt() is None, reason="mlir-opt is not installed")
def test_dump_loops_is_accepted_by_mlir_opt(workdir):
    run(workdir, "dump", "mymodel:loss", *INPUTS, "--grad", "0,1", "--stage", "loops", "-o", "loops.mlir")
    check_with_mlir_opt((workdir / "loops.mlir").read_text(), "loops.mlir")


@pytest.mark.skipif(find_mlir_opt() is None, reason="mlir-opt is not installed")
def test_dump_with_dynamic_sizes_shows_the_code_that_takes_them(workdir):
    """--dynamic on dump: the loops take `%size_rows` (valid MLIR), and the llvm and asm
    stages print without compiling anything to run."""
    dyn = ["--dynamic", "x:0:rows", "--dynamic", "idx:0:n"]
    run(workdir, "dump", "mymodel:loss", *INPUTS, "--grad", "0", *dyn, "--stage", "loops", "-o", "loops.mlir")
    text = (workdir / "loops.mlir").read_text()
    assert "%size_rows: index" in text and "%size_n: index" in text
    check_with_mlir_opt(text, "loops.mlir")
    asm = run(workdir, "dump", "mymodel:loss", *INPUTS, *dyn, "--stage", "asm").stdout
    assert "# mymodel.py:" in asm


def test_dump_dot_and_svg(workdir):
    run(workdir, "dump", "mymodel:loss", *INPUTS, "--stage", "graph", "--format", "dot", "-o", "g.dot")
    dot = (workdir / "g.dot").read_text()
    assert dot.startswith("digraph") and dot.count("->") >= 4
    if shutil.which("dot") is None:
        proc = run(workdir, "dump", "mymodel:loss", *INPUTS, "--format", "svg", ok=False)
        assert proc.returncode == 2 and "apt-get install graphviz" in proc.stderr
        return
    subprocess.run(["dot", "-Tsvg", str(workdir / "g.dot")], check=True, capture_output=True)
    run(workdir, "dump", "mymodel:loss", *INPUTS, "--stage", "optimized", "--format", "svg", "-o", "g.svg")
    root = ET.parse(workdir / "g.svg").getroot()
    svg = "{http://www.w3.org/2000/svg}"
    nodes = [g.find(svg + "title").text for g in root.iter(svg + "g") if g.get("class", "").split()[:1] == ["node"]]
    assert sorted(n for n in nodes if n.startswith("op")) == ["op0", "op1", "op2", "op3"]  # 4 ops
    run(workdir, "dump", "mymodel:loss", *INPUTS, "--stage", "graph", "--format", "png", "-o", "g.png")
    assert (workdir / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = run(workdir, "dump", "mymodel:loss", *INPUTS, "--grad", "0", "--stage", "all", "--format", "svg",
              "-o", "pics").stdout
    for stage in ("graph", "backward", "optimized"):
        ET.parse(workdir / "pics" / f"{stage}.svg")
        assert f"{stage}.svg" in out


def test_dump_all_writes_every_stage_with_times(workdir):
    out = run(workdir, "dump", "mymodel:loss", *INPUTS, "--grad", "0", "--stage", "all", "-o", "dumps").stdout
    for stage, suffix in [("graph", "txt"), ("backward", "txt"), ("optimized", "txt"), ("loops", "mlir"),
                          ("llvm", "ll"), ("asm", "s"), ("ptx", "ptx")]:
        assert (workdir / "dumps" / f"{stage}.{suffix}").stat().st_size > 0
        assert any(line.split()[0] == stage and "ms" in line for line in out.splitlines()), out
    import json
    times = json.loads((workdir / "dumps" / "times.json").read_text())["seconds"]
    assert set(times) == {"trace+optimize", "graph", "backward", "optimized", "loops", "llvm", "asm", "ptx"}
    assert all(t >= 0 for t in times.values())


@pytest.mark.parametrize("args, message", [
    (["dump", "nomodule:loss", *INPUTS], "cannot import module 'nomodule'"),
    (["dump", "missing.py:loss", *INPUTS], "no such file: missing.py"),
    (["dump", "mymodel:nope", *INPUTS], "module 'mymodel' has no attribute 'nope'"),
    (["dump", "mymodel:NOT_A_FUNCTION", *INPUTS], "is not callable"),
    (["dump", "mymodel", *INPUTS], "expected MODULE:FUNCTION"),
    (["dump", "mymodel:loss", "--input", "f33[8,3]"], "bad input spec 'f33[8,3]'"),
    (["dump", "mymodel:loss", "--input", "f32[8,x]"], "bad input spec"),
    (["dump", "mymodel:loss", "--input", "f32[99999999999,99999999999]"], "exceed the CLI's limit"),
    (["dump", "mymodel:loss", "--input", "f32[8,\u00b2]"], "bad input spec"),
    (["export", "mymodel:loss", *INPUTS, "--dynamic", "x:batch", "-o", "l.so"], "expected ARG:AXIS:NAME"),
    (["export", "mymodel:loss", *INPUTS, "--dynamic", "x:0:batch", "--dynamic", "idx:0:batch", "-o", "l.so"],
     "size 'batch' is 5 at 'x' axis 0 but 4 at 'idx' axis 0"),
    (["dump", "mymodel:loss", "--input", "f32[8,3]"], "cannot take 1 inputs"),
    (["dump", "mymodel:loss", *INPUTS, "--stage", "cubin"], "unknown stage 'cubin'"),
    (["dump", "mymodel:loss", *INPUTS, "--format", "jpeg"], "unknown format 'jpeg'"),
    (["dump", "mymodel:loss", *INPUTS, "--stage", "asm", "--format", "dot"], "stage asm is text only"),
    (["dump", "mymodel:loss", *INPUTS, "--grad", "7"], "--grad 7"),
    (["dump", "mymodel:loss", "--input", "f32[8,3]", "--input", "f32[5,9]", "--input", "i64[4]"],
     "matmul: inner dims do not match"),
])
def test_user_errors_are_one_line(workdir, args, message):
    proc = run(workdir, *args, ok=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracecomp: error:") and message in lines[0], proc.stderr


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="export needs 'cc'")
def test_export_into_a_directory_puts_both_files_inside(workdir):
    (workdir / "out").mkdir()
    out = run(workdir, "export", "mymodel:loss", *INPUTS, "-o", "out").stdout
    assert "wrote out/libloss.so, out/libloss.h and out/libloss.so.sha256" in out
    assert sorted(p.name for p in (workdir / "out").iterdir()) == ["libloss.h", "libloss.so", "libloss.so.sha256"]
    assert not (workdir / "out.h").exists()


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="export needs 'cc'")
def test_export_command(workdir):
    out = run(workdir, "export", "mymodel:loss", *INPUTS, "--grad", "0", "-o", "libloss.so").stdout
    assert "wrote libloss.so, libloss.h and libloss.so.sha256" in out
    assert (workdir / "libloss.h").exists()
    f = tc.load(str(workdir / "libloss.so"))
    rng = np.random.default_rng(5)
    w, x = rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal((5, 8)).astype(np.float32)
    idx = np.array([4, 0, 1, 1])
    value, grad = f(w, x, idx)
    sys.path.insert(0, str(workdir))
    try:
        import mymodel
        want_value, want_grad = tc.trace(tc.value_and_grad(mymodel.loss, argnums=0))(
            tc.tensor(w), tc.tensor(x), tc.tensor(idx))
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("mymodel", None)
    np.testing.assert_allclose(value.numpy(), want_value.numpy(), rtol=1e-5)
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-5, atol=1e-6)


def test_export_command_with_dynamic_sizes(workdir):
    """--dynamic: the index count and the rows of x are sizes of the call; indices are
    still checked against the run-time row count."""
    run(workdir, "export", "mymodel:loss", *INPUTS, "--grad", "0", "--dynamic", "idx:0:n",
        "--dynamic", "x:0:rows", "-o", "libdyn.so")
    assert "int64_t rows, int64_t n" in (workdir / "libdyn.h").read_text()
    f = tc.load(str(workdir / "libdyn.so"))
    sys.path.insert(0, str(workdir))
    try:
        import mymodel
        step = tc.trace(tc.value_and_grad(mymodel.loss, argnums=0))
        rng = np.random.default_rng(6)
        w = rng.standard_normal((8, 3)).astype(np.float32)
        for rows, n in ((2, 1), (9, 30)):
            x = rng.standard_normal((rows, 8)).astype(np.float32)
            idx = rng.integers(0, rows, n)
            for got, want in zip(f(w, x, idx), step(w, x, idx)):
                np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        with pytest.raises(tc.ArgumentError, match="out of bounds for dim 0 with size rows"):
            f(w, x[:2], np.array([0, 2]))
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("mymodel", None)


def test_subcommands_have_help(workdir):
    for sub in ("dump", "export", "ops"):
        assert "usage: tracecomp " + sub in run(workdir, sub, "--help").stdout


def test_the_readme_operator_table_is_the_generated_one():
    """README.md's table of operators is `tracecomp ops --markdown`, byte for byte."""
    from tracecomp.cli import ops_markdown
    from tracecomp.ops.table import default_table
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = readme.index("<!-- ops table: tracecomp ops --markdown -->\n") + len("<!-- ops table: tracecomp ops --markdown -->\n")
    end = readme.index("\n<!-- end of the ops table -->")
    assert readme[start:end] == ops_markdown(list(default_table().values())), \
        "README.md's operator table is stale: run `python tools/readme_ops_table.py`"


def test_ops_markdown_lists_pytorch_names():
    out = subprocess.run([sys.executable, "-m", "tracecomp.cli", "ops", "softplus", "--markdown"],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "| tracecomp | PyTorch | implemented as |"
    assert "| `tc.softplus` | `torch.nn.functional.softplus` | elementwise |" in out


def test_info_prints_the_host_and_the_choices(workdir, tmp_path, monkeypatch):
    import json
    from tracecomp.lower import hostcpu
    from tracecomp.runtime import host
    out = run(workdir, "info").stdout
    for start in ("cpu: ", "vector features: ", "caches: ", "generated loops use ", "matmul blocking: float32",
                  "matmul paths: float32", "threads: ", "compile cache: "):
        assert any(line.startswith(start) for line in out.splitlines()), (start, out)
    details = json.loads(run(workdir, "info", "--json").stdout)
    assert details["vector_register"] in ("zmm", "ymm", "xmm", "none") and details["matmul_blocks"]["float32"]["mr"] > 0
    assert details["matmul_paths"]["bfloat16"] in ("amx", "dpbf16ps", "widen")
    assert details["matmul_paths"]["float16"] in ("amx-fp16", "widen")
    # the caches as sysfs lists them (a made-up host), and none without sysfs
    for index, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0"), (2, "Unified", "2048K", "0"),
                                                         (3, "Unified", "32M", "0-7")]):
        d = tmp_path / "sysfs" / f"index{index}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    monkeypatch.setattr(hostcpu, "SYSFS_CACHES", tmp_path / "sysfs")
    assert [c["bytes"] for c in hostcpu.caches()] == [48 << 10, 2 << 20, 32 << 20]
    assert hostcpu.cache_bytes(1) == 48 << 10 and hostcpu.cache_bytes(2) == 2 << 20
    assert "caches: L1d 48 KiB, L2 2 MiB, L3 32 MiB (shared by CPUs 0-7)" in host.report({**details, "caches": hostcpu.caches()})
    monkeypatch.setattr(hostcpu, "SYSFS_CACHES", tmp_path / "nothing")
    assert hostcpu.caches() == [] and hostcpu.cache_bytes(2) is None and "caches: unknown (no sysfs)" in host.report({**details, "caches": []})
