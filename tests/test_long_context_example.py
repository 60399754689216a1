"""examples/long_context_gpt.py under hvdliterun: on cp=2 its loss goes down; on cp x tp and
cp=4 in ring mode (slow) it follows the same loss curve as one process (cp=1) to the printed
digits, and on dp x cp it learns."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(np_, *flags, steps=6):
    res = subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", "-np", str(np_), sys.executable]
        + [str(REPO / "examples" / "long_context_gpt.py"), "--steps", str(steps), "--corpus-bytes", "200000"]
        + list(flags),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[1]<stdout>:" not in res.stdout  # only rank 0 prints
    found = re.search(r"loss ([0-9.]+) -> ([0-9.]+) after %d steps" % steps, res.stdout)
    assert found, res.stdout + res.stderr
    return tuple(map(float, found.groups())), res.stdout


# Slow (~6 s): the example also runs in test_long_context_example_matches_one_process (slow).
@pytest.mark.slow
def test_long_context_example_learns_on_cp2():
    (first, last), out = _run(2, "--cp", "2", "--dp", "1")
    assert "mesh (pp=1, dp=1, ep=1, cp=2, tp=1) over 2 ranks" in out, out
    assert last < first - 1.0, out


@pytest.mark.slow  # three more launches; the attention itself is checked exactly in test_cp.py
def test_long_context_example_matches_one_process():
    one, _ = _run(1, "--cp", "1", "--dp", "1", "--mode", "allgather", steps=8)
    cp_tp, _ = _run(4, "--cp", "2", "--tp", "2", "--dp", "1", "--mode", "ulysses", steps=8)
    assert cp_tp == one
    ring, _ = _run(4, "--cp", "4", "--dp", "1", "--mode", "ring", steps=8)
    assert ring == one
    dp_cp, out = _run(4, "--cp", "2", "--dp", "2", steps=8)
    assert "dp=2, ep=1, cp=2" in out and dp_cp[1] < dp_cp[0] - 1.0, out
