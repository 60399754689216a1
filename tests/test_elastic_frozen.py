"""A frozen worker in an elastic job: a worker that stops itself (SIGSTOP; its sockets stay open,
so it never exits) is found by its ring neighbours' heartbeat, reported by the survivors to the
driver, SIGKILLed and dropped like a crashed one (its host blacklisted); the survivors finish
with every committed step exactly once. A worker that merely computes long is left alone."""

import os
import signal
import sys
from pathlib import Path

import pytest
from test_elastic import HOSTS3, SCRIPT, check_exactly_once, hvdliterun, worker_lines

from hvdlite.elastic.worker import frozen_rank

pytestmark = pytest.mark.elastic

# What the core's heartbeat reports (csrc/transport/tcp_control.cc), directly on the frozen rank's
# neighbours and inside an ABORT on the others.
_FOUND = (
    "allreduce 'grad' failed: rank 2 (host vm) stopped responding: no heartbeat from it for 4 s "
    "(its process is stopped or hung: SIGSTOP, ...)"
)
_RELAYED = "rank 1 (host vm) failed: rank 2 (host vm) stopped responding: no heartbeat from it for 4 s"


def test_frozen_rank_is_read_from_the_heartbeat_error_only():
    assert frozen_rank(_FOUND) == 2 and frozen_rank(_RELAYED) == 2
    assert frozen_rank(_FOUND.replace(" (host vm)", "")) == 2
    for other in (
        "rank 2 (host vm) closed its connection (the process exited or crashed?)",
        "rank 2 (host vm) stopped answering (no reply to TCP keepalive probes for several seconds",
        "stalled ranks: 2",
        None,
    ):
        assert frozen_rank(other) is None, other


def _kill_leftovers(pid_dir):
    """SIGKILLs any worker of the test still there (a failed test must not leave a stopped
    process behind); returns the pids it killed."""
    left = []
    for name in os.listdir(pid_dir):
        pid = int(name)
        try:
            cmdline = Path("/proc/%d/cmdline" % pid).read_bytes()
        except OSError:
            continue
        if b"elastic_train.py" in cmdline:
            os.kill(pid, signal.SIGKILL)
            left.append(pid)
    return left


# (hosts, -np, the frozen worker, its rank, the workers of generation 2). The second case freezes
# rank 0, on a host with a second worker, which leaves with it.
_CASES = [
    (HOSTS3, 3, "127.0.0.2[0]", 2, ["localhost[0]", "127.0.0.1[0]"]),
    ("localhost:2,127.0.0.1:2", 4, "localhost[0]", 0, ["127.0.0.1[0]", "127.0.0.1[1]"]),
]


# Slow (~6 s each: the liveness bound of 4 s, then the re-formation).
@pytest.mark.slow
@pytest.mark.parametrize("hosts,np_,victim,rank,survivors", _CASES)
def test_frozen_worker_is_killed_and_the_survivors_lose_no_committed_step(
    hosts, np_, victim, rank, survivors, tmp_path
):
    env = {"ELASTIC_STEPS": "20", "ELASTIC_FREEZE": victim + ":8", "ELASTIC_PID_DIR": str(tmp_path)}
    try:
        res = hvdliterun("-np", np_, "--min-np", 2, "-H", hosts, sys.executable, SCRIPT, env=env, timeout=180)
    finally:
        left = _kill_leftovers(tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not left, "workers left running: %s" % left
    log = check_exactly_once(res, 20)
    sizes = [size for _, size in log]  # step 8's allreduce may have completed on every rank
    assert sizes in ([np_] * 8 + [2] * 12, [np_] * 9 + [2] * 11), sizes
    # The driver names the frozen worker, its rank and host, the heartbeat's finding, and what it did.
    said = [
        line for line in res.stderr.splitlines() if "stopped responding" in line and "hvdliterun:" in line
    ]
    assert len(said) == 1, res.stderr[-4000:]
    print(said[0])
    host = victim.split("[")[0]
    assert (
        "%s (rank %d of generation 1, host %s) stopped responding: no heartbeat" % (victim, rank, host)
        in said[0]
    )
    assert "killing it (SIGKILL) and blacklisting host %s" % host in said[0]
    assert "generation 2: 2 worker(s): %s\n" % ", ".join(survivors) in res.stderr, res.stderr[-4000:]
    out = worker_lines(res.stdout)
    frozen_at = float(next(x for x in out[victim] if x.startswith("FREEZE")).split()[1])
    for wid in survivors:  # never restarted: one process each
        steps = [line.split() for line in out[wid] if line.startswith("STEP")]
        assert int(steps[0][1]) == 0 and int(steps[-1][1]) == 19, (wid, steps)
        resumed = min(float(s[4]) for s in steps if s[2] == "2")  # the first step on 2 ranks
        print("%s: first step of 2 ranks %.2f s after the freeze" % (wid, resumed - frozen_at))


# Slow (12 s of spinning): 12 s is three times HVDLITE_LIVENESS_SECONDS.
@pytest.mark.slow
def test_worker_computing_past_the_liveness_bound_is_not_killed():
    env = {
        "ELASTIC_STEPS": "10",
        "ELASTIC_STALL": "127.0.0.2[0]:4",
        "ELASTIC_STALL_S": "12",
        "ELASTIC_STALL_SPIN": "1",
    }
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, SCRIPT, env=env, timeout=180)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "stopped responding" not in res.stderr and "generation 2" not in res.stderr, res.stderr[-4000:]
    log = check_exactly_once(res, 10)
    assert {size for _, size in log} == {3}
