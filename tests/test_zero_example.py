"""examples/pytorch_zero_gpt.py trains (ZeRO-3, 2 ranks under hvdliterun) and its sharded
checkpoint consolidates into a plain state_dict."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_zero_gpt_example_learns(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", "-np", "2", sys.executable]
        + [
            str(REPO / "examples" / "pytorch_zero_gpt.py"),
            "--steps",
            "40",
            "--checkpoint",
            str(tmp_path / "ck"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    losses = [float(v) for v in re.findall(r"\[0\]<stdout>:step +\d+ +loss ([0-9.]+)", out)]
    assert len(losses) == 3 and losses[-1] < 0.7 * losses[0], out
    assert "consolidated into model.pt" in out and (tmp_path / "ck" / "model.pt").exists()
