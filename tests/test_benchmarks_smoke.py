"""benchmarks/collectives.py still runs and hvdlite's results in it are correct.

A smoke test only: hvdlite alone, 2 ranks, two tiny sizes, a short run. It checks that the
script finishes and that the #wrong column (wrong elements after the correctness pass on
rank-dependent data) is 0 for every collective; it never looks at a time.
"""

import json
import os
import shutil
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
    out = _run_helper("_allreduce_busbw.py", "--sizes", "4K,64K", "--reps", "2", "--floor")
    rows = [line.split(":", 1)[1].split() for line in out.splitlines()]
    rows = [r for r in rows if r and r[0].isdigit()]
    assert [r[0] for r in rows] == ["4096", "65536"], out
    assert all(r[5] == "0" for r in rows), out  # the #wrong column
    assert all(len(r) == 9 and float(r[7]) > 0 and float(r[8]) > 0 for r in rows), out  # floor_us, x_floor


def test_allreduce_latency_and_fusion_helpers_run():
    assert "median" in _run_helper("_allreduce_latency.py", "--calls", "20", "--reps", "2")
    assert "161 tensors" in _run_helper("_fusion_resnet50.py", "--reps", "1")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
def test_mpi_path_helper_runs_hvdlite_under_mpirun():
    """_mpi_path.py's ring and mpi paths through the shared launcher and worker: one row, no
    wrong elements."""
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "_mpi_path.py"), "--paths", "ring,mpi"]
    cmd += ["--ops", "allreduce", "--sizes", "4096", "--reps", "2", "--idle-wait", "0"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("allreduce ")]
    assert len(rows) == 1 and rows[0][:3] == ["allreduce", "4", "KiB"] and rows[0][-1] == "0", run.stdout


@pytest.mark.slow  # the whole suite's report; the entry points are smoked one by one above
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


COMPARE = os.path.join(ROOT, "benchmarks", "compare_builds.py")


def _compare_builds():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import compare_builds
    finally:
        sys.path.pop(0)
    return compare_builds


def test_compare_builds_refuses_a_tree_that_is_not_built(tmp_path):
    run = subprocess.run(
        [sys.executable, COMPARE, "--before", str(tmp_path), "--quick"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "no hvdlite/_core*.so" in run.stderr, run.stderr


def test_compare_builds_table_takes_medians_over_rounds_and_checks_the_goals():
    """The report from given per-round values (no job runs): a median over rounds per tree, the
    end-to-end ratio against each round's no-communication step, the peer, after/peer as the
    median of each round's ratio (not the ratio of the medians), and the goal."""
    cb = _compare_builds()
    args = cb.parse_args(["--before", ROOT, "--quick", "--only", "latency", "torch", "tf"])
    assert args.trees == {"before": ROOT, "after": ROOT} and args.mode["rounds"] == 2
    assert [j[:3] for j in cb.round_jobs(args, 1)][:3] == [
        ("latency", "shm", "after"),
        ("latency", "shm", "before"),
        ("latency", "shm", "peer"),
    ]  # the trees' order alternates from round to round
    torch_jobs = [j[2] for j in cb.round_jobs(args, 0) if j[0] == "torch"]
    assert torch_jobs == ["before", "nocomm", "after", "peer"]  # the floor next to both trees

    def result(group, variant, who, rnd, **values):
        return {"group": group, "variant": variant, "who": who, "round": rnd, "values": values, "error": None}

    results = [
        result("latency", "shm", "before", 0, **{"time.4096": 10e-6, "busbw.1048576": 6.0}),
        result("latency", "shm", "before", 1, **{"time.4096": 12e-6, "busbw.1048576": 6.0}),
        result("latency", "shm", "after", 0, **{"time.4096": 4e-6, "busbw.1048576": 6.0}),
        result("latency", "shm", "after", 1, **{"time.4096": 6e-6, "busbw.1048576": 6.0}),
        result("latency", "shm", "peer", 0, **{"time.4096": 2e-6, "busbw.1048576": 4.0}),
        result("latency", "shm", "peer", 1, **{"time.4096": 4e-6, "busbw.1048576": 4.0}),  # a slow round
        result("torch", "mlp", "nocomm", 0, step=0.2),
        result("torch", "mlp", "before", 0, step=0.3),
        result("torch", "mlp", "after", 0, step=0.21),
        result("torch", "mlp", "peer", 0, step=0.42),
    ]
    rows = {line.split(" | ")[0][2:]: line.strip("| ").split(" | ") for line in cb.table(results, args)[2:]}
    assert rows["4 KiB allreduce latency (shared memory)"][1:] == [
        "11.0 µs",
        "5.0 µs",
        "Open MPI 3.0 µs",
        "1.75×",  # rounds 4/2 and 6/4 (the medians' ratio would be 5/3)
        "after/peer ≤ 2×: met",
    ]
    assert rows["1 MiB allreduce busbw (shared memory)"][4:] == ["1.50×", "after/peer ≥ 1.2×: met"]
    assert rows["4 KiB allreduce latency (TCP)"][1:4] == ["", "", ""]  # no TCP job ran
    assert rows["torch 25M MLP step ÷ no-communication step"][1:] == [
        "1.50×",
        "1.05×",
        "DDP 2.10×",
        "0.50×",
        "after ≤ 1.08×: met",
    ]
    assert rows["TensorFlow 25M MLP step ÷ no-communication step"][1:3] == ["", ""]
    assert not any(r[0].startswith("ResNet") for r in rows.values())  # not in --only


@pytest.mark.slow
def test_compare_builds_one_round_writes_the_table(tmp_path):
    """A real round of the fusion measure, this tree against itself: every cell of its row is
    filled (the peer's where Open MPI runs here) and the report says what ran."""
    cmd = [sys.executable, COMPARE, "--before", ROOT, "--quick", "--only", "fusion", "--rounds", "1"]
    cmd += ["--idle-wait", "0", "--out-dir", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    text = (tmp_path / "compare_builds.md").read_text()
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ResNet")]
    assert len(rows) == 1 and rows[0][1].endswith("ms") and rows[0][2].endswith("ms"), text
    if "skipping the mpi peer" not in run.stdout:
        assert rows[0][3].startswith("Open MPI per tensor") and rows[0][4].endswith("×"), text
    assert "- before: %s" % ROOT in text and "1 rounds of latency/fusion" in text, text
    assert (tmp_path / "compare_builds.json").exists()


@pytest.mark.slow
def test_torch_backend_quick_is_correct_and_reports_each_ratio(tmp_path):
    """benchmarks/torch_backend.py --quick: the hvdlite group's all_reduce equals gloo's, and every
    row of the report (both libraries, every model variant) is there."""
    script = os.path.join(ROOT, "benchmarks", "torch_backend.py")
    r = subprocess.run(
        [sys.executable, script, "--quick", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "torch_backend.json") as f:
        data = json.load(f)
    assert [row["wrong"] for row in data["allreduce"]] == [0, 0]
    assert sorted(data["models"]["times"]) == sorted(
        ["no communication", "DDP gloo", "DDP hvdlite", "FSDP2 gloo", "FSDP2 hvdlite"]
    )
