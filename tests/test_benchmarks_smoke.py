"""benchmarks/collectives.py still runs and hvdlite's results in it are correct.

A smoke test only: hvdlite alone, 2 ranks, two tiny sizes, a short run. It checks that the
script finishes and that the #wrong column (wrong elements after the correctness pass on
rank-dependent data) is 0 for every collective; it never looks at a time.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "collectives.py")
OPS = {"allreduce", "allgather", "broadcast", "alltoall", "reducescatter"}


def _table_rows(markdown):
    """Yields (op, {column: cell}) for every data row of the report's tables."""
    op, header = None, None
    for line in markdown.splitlines():
        if line.startswith("## "):
            op, header = line[3:].split(",")[0], None
        elif line.startswith("|") and op:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|-"):
                yield op, dict(zip(header, cells))


def test_collectives_quick_hvdlite_has_no_wrong_elements(tmp_path):
    cmd = [
        sys.executable,
        SCRIPT,
        "--quick",
        "--peers",
        "none",
        "--ranks",
        "2",
        "--sizes",
        "4K,64K",
        "--idle-wait",
        "0",
        "--no-plot",
        "--out-dir",
        str(tmp_path),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = list(_table_rows((tmp_path / "collectives.md").read_text()))
    assert {op for op, _ in rows} == OPS, rows
    assert len(rows) == 2 * len(OPS), rows
    for op, row in rows:
        assert row["library"] == "hvdlite" and row["#wrong"] == "0", (op, row)


def _run_helper(name, *args):
    """Runs benchmarks/<name> as the 2 ranks of an hvdliterun job; returns rank 0's stdout."""
    cmd = [sys.executable, "-m", "hvdlite.runner.launch", "-np", "2", sys.executable]
    cmd += [os.path.join(ROOT, "benchmarks", name), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return "\n".join(line for line in run.stdout.splitlines() if line.startswith("[0]<stdout>:"))


def test_allreduce_busbw_helper_reports_no_wrong_elements():
    out = _run_helper("_allreduce_busbw.py", "--sizes", "4K,64K", "--reps", "2")
    rows = [line.split(":", 1)[1].split() for line in out.splitlines()]
    rows = [r for r in rows if r and r[0].isdigit()]
    assert [r[0] for r in rows] == ["4096", "65536"], out
    assert all(r[5] == "0" for r in rows), out  # the #wrong column


def test_allreduce_latency_and_fusion_helpers_run():
    assert "median" in _run_helper("_allreduce_latency.py", "--calls", "20", "--reps", "2")
    assert "161 tensors" in _run_helper("_fusion_resnet50.py", "--reps", "1")


def test_suite_report_has_each_ratio_against_its_peer(tmp_path):
    """collectives.py against gloo (allreduce, two sizes), then the suite's report of it: one
    ratio row per size, the script's table and its plot embedded."""
    cmd = [sys.executable, SCRIPT, "--quick", "--peers", "gloo", "--ops", "allreduce", "--sizes", "4K,64K"]
    cmd += ["--idle-wait", "0", "--out-dir", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if "skipping gloo" in run.stdout:
        pytest.skip("gloo cannot run here: " + run.stdout.splitlines()[0])
    assert run.returncode == 0, run.stdout + run.stderr
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from _summary import report
    finally:
        sys.path.pop(0)
    text = report(str(tmp_path), ["collectives"], {"collectives": (0, 1.0)}, "quick", 1.0, "- host")
    ratios = [line for line in text.splitlines() if line.startswith("| collectives | allreduce")]
    assert len(ratios) == 2 and all(line.endswith("× |") for line in ratios), text
    assert "![collectives](collectives.png)" in text and (tmp_path / "collectives.png").exists()
    assert "### allreduce, 2 ranks" in text, text  # the script's own table, one level down
