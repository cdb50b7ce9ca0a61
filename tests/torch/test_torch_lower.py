"""tracecomp.torch.lower (a model's imported graphs as tc.trace's Lowered objects), `tracecomp
dump --torch`, and the backend's cache option."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (a test-only dependency)")
if not hasattr(torch, "compile"):          # tests/torch/ itself, seen as a namespace package
    pytest.skip("torch not installed (a test-only dependency)", allow_module_level=True)

import tracecomp as tc  # noqa: E402
import tracecomp.torch as tt  # noqa: E402
from tracecomp.transforms.stages import Lowered  # noqa: E402

MODEL = textwrap.dedent('''
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.tanh(self.fc(x)).sum(1)

    net = Net()

    def scale(x, y):
        return (x * y).sin()

    def breaks(x):
        print("a graph break")
        return x + 1
''')


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "tmodel.py").write_text(MODEL)
    return tmp_path


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def _net():
    torch.manual_seed(0)
    return Net()


def test_lower_gives_the_forward_and_backward_as_lowered_objects():
    model, x = _net(), torch.randn(2, 4)
    lowered = tt.lower(model, x)
    assert isinstance(lowered.forward, Lowered) and isinstance(lowered.backward, Lowered)
    assert list(lowered.graphs) == ["forward", "backward"]
    forward = lowered.forward.as_text("graph")
    assert "tc.matmul" in forward and "tc.tanh" in forward
    assert "test_torch_lower.py" in lowered.forward.as_text("optimized")     # the model's own lines
    assert [tuple(v.type.shape) for v in lowered.backward.graph.outputs][:2] == [(3, 4), (3,)]
    assert "define" in lowered.forward.as_text("llvm")
    assert all(p.grad is None for p in model.parameters())          # .grad left as it was


def test_lower_under_no_grad_gives_the_inference_graph_alone():
    with torch.no_grad():
        lowered = tt.lower(_net(), torch.randn(2, 4))
    assert lowered.backward is None and list(lowered.graphs) == ["forward"]
    run = lowered.forward.run                       # the same object tc.trace's lower gives
    assert callable(run) and "tc.tanh" in lowered.forward.as_text("graph")


def test_kernel_names_are_identifiers_where_torch_records_no_line():
    """nn.Sequential's nodes carry no stack trace: their ops are located at AOTAutograd's
    generated frame ("subclass_codegen.py:codegen(...)"), which once put ':' and '(' into
    kernel names (LLVM's NVPTX backend aborts the process on those)."""
    lowered = tt.lower(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()), torch.randn(2, 4))
    for part in lowered.graphs.values():
        names = [k.name for k in part.program.kernels]
        assert names and all(re.fullmatch(r"[A-Za-z0-9_]+", n) for n in names), names


def test_lower_refuses_graph_breaks_and_fallbacks():
    with pytest.raises(tc.TracecompError, match="not one graph"):
        tt.lower(lambda x: print("x") or x + 1, torch.randn(3))
    torch._dynamo.reset()
    with pytest.raises(tc.TracecompError, match="i0"):
        tt.lower(lambda x: torch.special.i0(x) + 1, torch.randn(3))


def cli(workdir, *args, ok=True):
    done = subprocess.run([sys.executable, "-m", "tracecomp.cli", *args], cwd=workdir, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert (done.returncode == 0) == ok, done.stderr
    return done


def test_dump_torch_prints_a_stage_of_either_graph(workdir):
    out = cli(workdir, "dump", "--torch", "tmodel:Net", "--input", "f32[2,4]", "--stage", "graph").stdout
    assert "func.func @forward" in out and "tc.tanh" in out and 'loc("tmodel.py":' in out
    out = cli(workdir, "dump", "--torch", "tmodel.py:net", "--input", "f32[2,4]", "--graph", "backward",
              "--stage", "optimized").stdout
    assert "func.func @backward" in out
    out = cli(workdir, "dump", "--torch", "tmodel:scale", "--input", "f32[3]", "--input", "f32[3]", "--grad", "1",
              "--graph", "backward", "--stage", "graph").stdout
    assert "tc.cos" in out


def test_dump_torch_all_writes_each_graph_into_its_folder(workdir):
    cli(workdir, "dump", "--torch", "tmodel:net", "--input", "f32[2,4]", "--stage", "all", "-o", "dumps")
    for graph in ("forward", "backward"):
        for name in ("graph.txt", "optimized.txt", "loops.mlir", "llvm.ll", "asm.s", "times.json"):
            assert (workdir / "dumps" / graph / name).stat().st_size > 0, (graph, name)


@pytest.mark.parametrize("args, message", [
    (["tmodel:scale", "--input", "f32[3]", "--input", "f32[3]", "--graph", "backward"], "no backward graph"),
    (["tmodel:net", "--input", "f32[2,4]", "--graph", "sideways"], "unknown graph"),
    (["tmodel:net", "--input", "f32[2,4]", "--dynamic", "x:0:batch"], "--dynamic"),
    (["tmodel:scale", "--input", "i64[3]", "--input", "f32[3]", "--grad", "0"], "not a float tensor"),
    (["tmodel:breaks", "--input", "f32[3]"], "not one graph"),
])
def test_dump_torch_user_errors_are_one_line(workdir, args, message):
    err = cli(workdir, "dump", "--torch", *args, ok=False).stderr
    assert err.startswith("tracecomp: error:") and message in err and err.count("\n") == 1, err


def test_graph_without_torch_is_refused(workdir):
    err = cli(workdir, "dump", "tmodel:scale", "--input", "f32[3]", "--input", "f32[3]", "--graph", "backward",
              ok=False).stderr
    assert "--torch" in err


def _compile_and_run(options, seed: float):
    f = torch.compile(lambda a: (a * seed).sin() + seed, backend="tracecomp", options=options)
    x = torch.randn(11)
    torch.testing.assert_close(f(x), (x * seed).sin() + seed)


def test_the_cache_option_names_a_folder(tmp_path):
    folder = tmp_path / "models"
    _compile_and_run({"cache": str(folder)}, 3.25)
    assert any((folder / "v4").rglob("*.o")), "no entry in the named folder"
    default = tc.compile_cache.directory
    assert default != folder                               # the process-wide setting is untouched


def test_the_cache_option_turns_it_off():
    stats = tc.compile_cache.stats
    before = (stats.hits, stats.misses, stats.stores)
    _compile_and_run({"cache": False}, 5.75)
    assert (stats.hits, stats.misses, stats.stores) == before
    assert tc.compile_cache.enabled                      # only inside this model's compiles


def test_the_cache_option_is_checked():
    f = torch.compile(lambda a: a + 1, backend="tracecomp", options={"cache": 3})
    with pytest.raises(Exception, match="option cache takes False, True or a folder"):
        f(torch.ones(2))


def test_scoped_cache_settings_are_per_thread(tmp_path):
    import threading
    seen = {}
    with tc.compile_cache.scoped(directory=tmp_path):
        with tc.compile_cache.off():
            assert not tc.compile_cache.enabled and tc.compile_cache.directory == tmp_path
        thread = threading.Thread(target=lambda: seen.update(folder=tc.compile_cache.directory))
        thread.start()
        thread.join()
    assert seen["folder"] != tmp_path and tc.compile_cache.directory != tmp_path
