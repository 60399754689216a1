"""The PyTorch examples run end to end under hvdliterun (short settings)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _launch(*script_args):
    res = subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", "-np", "2", sys.executable]
        + [str(a) for a in script_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_pytorch_digits_learns():
    out = _launch(REPO / "examples" / "pytorch_digits.py", "--epochs", "3")
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy ([0-9.]+) on 2 ranks", out).group(1))
    assert accuracy > 0.8, out
    assert "epoch  3" in out and "[1]<stdout>:" not in out  # only rank 0 prints


@pytest.mark.slow  # Horovod's synthetic benchmark: the digits example and the README tour train by default
def test_pytorch_synthetic_benchmark_reports_rates():
    out = _launch(
        REPO / "examples" / "pytorch_synthetic_benchmark.py", "--num-iters", "2", "--num-warmup-batches", "1"
    )
    assert re.search(r"Total img/sec on 2 rank\(s\): [0-9.]+", out), out


def run_readme_tour(heading, tmp_path):
    """Runs the first python block after README's `heading` on 2 ranks; checks both finish."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(heading) :]
    tour = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "tour.py"
    script.write_text(tour + "\nimport os; print('tour done', os.environ['HVDLITE_RANK'])\n")
    out = _launch(script)
    assert "[0]<stdout>:tour done 0" in out and "[1]<stdout>:tour done 1" in out


def test_readme_pytorch_tour_runs_on_two_ranks(tmp_path):
    run_readme_tour("## API tour (PyTorch)", tmp_path)


@pytest.mark.slow  # a benchmark's worker, as test_e2e_tf_benchmark_row_runs
def test_e2e_torch_benchmark_rows_run():
    """benchmarks/e2e_torch.py's hvdlite rows work (a smoke run; times are not judged)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import e2e_torch
    finally:
        sys.path.pop(0)
    for row in ("hvdlite", "hvdlite-fp16"):
        result = e2e_torch.run_row(row, "cnn", 2, idle_wait=0.0)
        assert result["median_s"] > 0 and result["params"] > 0, result


@pytest.mark.slow  # about 15 s: 26 sharded tables, a few hundred steps
def test_dlrm_sparse_learns():
    out = _launch(
        REPO / "examples" / "dlrm_sparse.py", "--steps", "150", "--max-rows", "20000", "--batch", "256"
    )
    before = float(re.search(r"AUC before training ([0-9.]+)", out).group(1))
    after = float(re.search(r"AUC after 150 steps: ([0-9.]+)", out).group(1))
    assert after > before + 0.1 and after > 0.6, out
