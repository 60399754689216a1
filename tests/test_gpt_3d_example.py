"""examples/pytorch_gpt_3d.py runs under hvdliterun on 4 ranks (pp=2 x tp=2), prints the mesh
on rank 0 only, and its loss goes down."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # the example's parallelism is checked exactly by tests/test_mesh_3d.py
def test_gpt_3d_example_learns():
    res = subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", "-np", "4", sys.executable]
        + [
            str(REPO / "examples" / "pytorch_gpt_3d.py"),
            "--steps",
            "12",
            "--layers",
            "2",
            "--corpus-bytes",
            "200000",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "[0]<stdout>:mesh (pp=2, dp=1, ep=1, cp=1, tp=2) over 4 ranks" in out, out
    assert "[1]<stdout>:" not in out  # only rank 0 prints
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+) after 12 steps", out).groups())
    assert last < first - 1.0, out
