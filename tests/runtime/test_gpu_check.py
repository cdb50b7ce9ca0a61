"""benchmarks/gpu_check.py, issue 39's prepared GPU check, run on the host emulator: every
step but the pytest subset, at small sizes, with its report files."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import gpu_check  # noqa: E402


def test_the_check_runs_on_the_emulator_and_writes_its_report(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACECOMP_CUDA_EMULATOR", "1")
    code = gpu_check.main(["--emulator", "--quick", "--no-tests", "--workloads", "W1,W4", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert code == 0
    assert report["device"]["emulator"] and report["device"]["device"] == "tracecomp emulator"
    rows = {r["name"]: r for r in report["workloads"]}
    assert set(rows) == {"W1", "W4"}
    for row in rows.values():                # checked against float64 NumPy, then timed
        assert row["tracecomp_ok"] and row["tracecomp_s"] > 0
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| W4: MLP train step" in table and "copy bandwidth" in table


def test_junit_results_are_counted(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text("""<testsuites><testsuite>
      <testcase classname="tests.runtime.test_cuda_driver" name="test_gpu_matches_the_cpu_backend[add-0]"/>
      <testcase classname="tests.runtime.test_cuda_driver" name="test_gpu_matches_the_cpu_backend[mul-0]"><failure/></testcase>
      <testcase classname="tests.lower.test_ptx" name="test_x"><skipped/></testcase>
      <testcase classname="tests.lower.test_ptx" name="test_y"/>
    </testsuite></testsuites>""")
    counts = gpu_check._junit_counts(str(xml))
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["op_samples_on_device"]) == (2, 1, 1, 1)
    assert counts["failures"] == ["tests.runtime.test_cuda_driver::test_gpu_matches_the_cpu_backend[mul-0]"]


@pytest.mark.parametrize("flag", ["--quick"])
def test_a_failing_workload_fails_the_check(tmp_path, monkeypatch, flag):
    monkeypatch.setenv("TRACECOMP_CUDA_EMULATOR", "1")
    wrong = [w for w in gpu_check.workloads(quick_sizes=True) if w.name == "W1"]
    wrong[0].reference = lambda x: x * 0 + 1            # a result that cannot match
    monkeypatch.setattr(gpu_check, "workloads", lambda quick_sizes: wrong)
    assert gpu_check.main(["--emulator", flag, "--no-tests", "--workloads", "W1", "--out", str(tmp_path)]) == 1
    row = json.loads((tmp_path / "gpu_check.json").read_text())["workloads"][0]
    assert not row["tracecomp_ok"] and "WRONG" in (tmp_path / "gpu_check.md").read_text()
