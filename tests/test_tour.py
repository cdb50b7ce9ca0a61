"""The README's tour runs (examples/tour.py), so the documented API stays true."""
import pathlib
import runpy

import pytest

TOUR = pathlib.Path(__file__).resolve().parent.parent / "examples" / "tour.py"


@pytest.mark.skipif(not TOUR.exists(), reason="examples/ is not next to the tests")
def test_tour_runs(capsys):
    runpy.run_path(str(TOUR), run_name="__main__")
    out = capsys.readouterr().out
    assert "func.func @mlp" in out and "True" in out and "MeanBackward0" in out
