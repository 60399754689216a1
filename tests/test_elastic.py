"""Elastic training end to end: `hvdliterun --min-np` over localhost "hosts" (localhost,
127.0.0.1, 127.0.0.2, ... are distinct hosts to the driver; no ssh), running
tests/elastic_train.py. Survivors keep their processes: they raise HorovodInternalError,
restore the last commit, re-form and finish with every committed step done exactly once."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "tests" / "elastic_train.py")
LINE = re.compile(r"^\[([^\]]+\])\]<(stdout|stderr)>:(.*)$")

pytestmark = pytest.mark.elastic


def hvdliterun(*args, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", *[str(a) for a in args]],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def worker_lines(text, stream="stdout"):
    """{worker id: [line, ...]} of the prefixed lines of `stream`."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(2) == stream:
            out.setdefault(m.group(1), []).append(m.group(3))
    return out


def reference_weights(log):
    """Replays the committed steps of tests/elastic_train.py."""
    w = np.zeros(4)
    for step, size in log:
        w = w - 0.1 * np.mean([(step + 1) * 0.01 + r for r in range(size)])
    return w


def done_of(res):
    """(log, w) from rank 0's DONE line."""
    for lines in worker_lines(res.stdout).values():
        for line in lines:
            if line.startswith("DONE "):
                log_text, _, w_text = line[5:].partition("] [")
                return [tuple(x) for x in json.loads(log_text + "]")], json.loads("[" + w_text)
    raise AssertionError("no DONE line:\n" + res.stdout[-3000:] + res.stderr[-3000:])


def check_exactly_once(res, steps):
    log, w = done_of(res)
    assert [s for s, _ in log] == list(range(steps)), log
    np.testing.assert_allclose(w, reference_weights(log), rtol=1e-12)
    return log


HOSTS3 = "localhost:1,127.0.0.1:1,127.0.0.2:1"


@pytest.mark.parametrize("how", ["ELASTIC_KILL", "ELASTIC_RAISE"])
def test_survivors_of_a_failed_worker_reform_and_lose_no_committed_step(how):
    env = {"ELASTIC_STEPS": "20", how: "127.0.0.2[0]:8"}
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, SCRIPT, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    log = check_exactly_once(res, 20)
    # step 8's allreduce was submitted before the failure: it may have completed on 3 ranks
    sizes = [size for _, size in log]
    assert sizes in ([3] * 8 + [2] * 12, [3] * 9 + [2] * 11), sizes
    err = worker_lines(res.stderr, "stderr")
    assert "generation 2: 2 worker(s): localhost[0], 127.0.0.1[0]" in res.stderr
    if how == "ELASTIC_RAISE":
        assert any("fails on purpose" in line for line in err.get("127.0.0.2[0]", [])), res.stderr
    # the survivors were never restarted: one process each (a restarted worker gets a new
    # name), from step 0 to the end (the step whose commit met the failure prints nothing)
    out = worker_lines(res.stdout)
    assert sorted(out) == ["127.0.0.1[0]", "127.0.0.2[0]", "localhost[0]"]
    for wid in ("localhost[0]", "127.0.0.1[0]"):
        steps = [int(line.split()[1]) for line in out[wid] if line.startswith("STEP")]
        assert steps[0] == 0 and steps[-1] == 19 and steps == sorted(set(steps)), (wid, steps)
