"""A host that goes silent (power loss, link down: no FIN, no RST) is found by every surviving
rank with the default settings, each error naming the host; a rank that computes for a long
time without a collective is not declared dead (issue 29, item 4). A rank whose process is
stopped (SIGSTOP) while its sockets stay open is found by its ring neighbours' heartbeat, on one
host as across hosts, and every survivor's pending collective fails naming it; a rank that spins
in Python holding the GIL is still alive (issue 42, item 6).

The host tests run ranks on simulated hosts (tests/simhosts.py), one per host, each started
through its host's sshd by this test, with a rendezvous store this test hosts: no launcher
watches them, so what each survivor reports is what its own transport found.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import run_ranks

from hvdlite.common.native import core

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Steps until told to stop; on the first error prints how long after the last good step it
# came, and the message. A rank that was told to compute first sleeps that long between two
# collectives, without touching hvdlite. The stop is decided together: each rank adds whether
# it sees the stop file to the step's allreduce, so all leave after the same step (a rank that
# looked just before the file appeared would otherwise start one more allreduce against a
# rank that had shut down).
RANK = r"""
import os, signal, sys, time
import numpy as np
import hvdlite as hvd
hvd.init()
print("READY", flush=True)
last = time.monotonic()
pause = float(os.environ.get("LIVENESS_PAUSE", "0"))
step = 0
freeze = int(os.environ.get("LIVENESS_FREEZE", "-1"))
try:
    while True:
        if step == 5 and hvd.rank() == freeze:
            os.kill(os.getpid(), signal.SIGSTOP)
        x = np.ones(1000)
        x[0] = 1000.0 if os.path.exists(os.environ["LIVENESS_STOP"]) else 0.0
        seen = hvd.allreduce(x, name="loop")[0]  # > 0: some rank saw the stop file
        last = time.monotonic()
        step += 1
        if step == 5 and pause:
            time.sleep(pause)
            print("RESUMED", flush=True)
        if seen > 0:
            print("STOPPED", step, flush=True)
            break
        time.sleep(0.02)
except Exception as e:
    print("FAILED %.2f %s" % (time.monotonic() - last, str(e).replace("\n", " ")), flush=True)
    os._exit(0)
hvd.shutdown()
"""


def _start_ranks(cluster, tmp_path, env_extra=None):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    secret = os.urandom(32)
    server = core.TcpStoreServer(cluster.launcher_addr, 0, secret)
    procs = []
    for rank, host in enumerate(cluster.hosts):
        env = {
            "HVDLITE_RANK": rank,
            "HVDLITE_SIZE": len(cluster.hosts),
            "HVDLITE_STORE_ADDR": "%s:%d" % (cluster.launcher_addr, server.port),
            "HVDLITE_SECRET": secret.hex(),
            "PYTHONPATH": REPO,
            "LIVENESS_STOP": str(tmp_path / "stop"),
            "OMP_NUM_THREADS": 1,
        }
        env.update(env_extra or {})
        assigns = " ".join("%s=%s" % kv for kv in env.items())
        cmd = "cd %s && exec env %s %s %s" % (REPO, assigns, sys.executable, script)
        procs.append(
            subprocess.Popen(
                ["/usr/bin/ssh", "-F", cluster.ssh_config, host.addr, cmd],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        )
    for p in procs:
        line = p.stdout.readline()
        assert line.startswith("READY"), (line, p.stderr.read()[-3000:] if p.poll() is not None else "")
    return server, procs


def test_silent_host_is_named_on_every_survivor(simhosts, tmp_path):
    cluster = simhosts(4)
    server, procs = _start_ranks(cluster, tmp_path)
    try:
        time.sleep(1.0)
        victim = cluster.hosts[2]
        crashed_at = time.monotonic()
        cluster.crash_host(victim)
        found = {}
        for rank in (0, 1, 3):
            out, err = procs[rank].communicate(timeout=90)
            failed = [line for line in out.splitlines() if line.startswith("FAILED")]
            assert failed, (rank, out[-2000:], err[-2000:])
            found[rank] = (time.monotonic() - crashed_at, failed[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
    for rank, (after, line) in found.items():
        print("rank %d: error %.1f s after the crash: %s" % (rank, after, line[:300]))
        assert victim.name in line, line  # every survivor's error names the silent host
        # A silent host is found by whichever bound expires first under load: its TCP keepalive
        # probes ("stopped answering") or its missing heartbeat ("stopped responding").
        assert "stopped answering" in line or "stopped responding" in line, line
    # The default HVDLITE_TIMEOUT_SECONDS is 120 s: reaching here within the 90 s bound above
    # shows liveness, not the transfer timeout, found it (the times are printed above).


def test_rank_computing_long_is_not_declared_dead(simhosts, tmp_path):
    cluster = simhosts(2)
    # Both ranks sleep 12 s (three times HVDLITE_LIVENESS_SECONDS) between two collectives,
    # without touching hvdlite: neither may be declared dead.
    server, procs = _start_ranks(cluster, tmp_path, {"LIVENESS_PAUSE": "12"})
    try:
        time.sleep(14)
        (tmp_path / "stop").write_text("")
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert "FAILED" not in out and "RESUMED" in out and "STOPPED" in out, (out[-2000:], err[-2000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()


def test_stopped_rank_on_another_host_is_named_on_every_survivor(simhosts, tmp_path):
    # Rank 2 stops itself (SIGSTOP) after step 5: its host and sockets stay up, so only the
    # heartbeat of its ring neighbours (ranks 1 and 3) finds it; rank 0 learns from them.
    cluster = simhosts(4)
    server, procs = _start_ranks(cluster, tmp_path, {"LIVENESS_FREEZE": "2"})
    try:
        found = {}
        for rank in (0, 1, 3):
            out, err = procs[rank].communicate(timeout=90)
            failed = [line for line in out.splitlines() if line.startswith("FAILED")]
            assert failed, (rank, out[-2000:], err[-2000:])
            found[rank] = failed[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
    for rank, line in found.items():
        print("rank %d: %s" % (rank, line[:300]))
        assert "rank 2 (host %s)" % cluster.hosts[2].name in line, line
        assert "stopped responding" in line, line


# One host: rank `victim` stops itself after a few steps; every survivor's next allreduce must
# fail naming it (the default HVDLITE_TIMEOUT_SECONDS is 120 s, so a failure at all shows the
# heartbeat found it). Once every survivor has failed (files in `tmp`), the victim's right
# neighbour resumes it (SIGCONT), and the victim finds its job over too.
def _frozen_rank(victim, tmp):
    import hvdlite as hvd

    hvd.init()
    pids = hvd.allgather(np.array([os.getpid()], np.int64), name="pids")
    for i in range(3):
        hvd.allreduce(np.ones(4), name="warm%d" % i)
    if hvd.rank() == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
        try:
            hvd.allreduce(np.ones(4), name="after")
            return ("completed",)
        except hvd.HvdliteError as e:
            return ("resumed", type(e).__name__, str(e))
    start = time.monotonic()
    try:
        hvd.allreduce(np.ones(4), name="after")
        result = ("completed",)
    except hvd.HvdliteError as e:
        result = ("failed", type(e).__name__, str(e), round(time.monotonic() - start, 2))
    open(os.path.join(tmp, "failed.%d" % hvd.rank()), "w").close()
    if hvd.rank() == (victim + 1) % hvd.size():
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp)) < hvd.size() - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int(pids[victim]), signal.SIGCONT)
    return result


@pytest.mark.parametrize("size", [2, 4])
def test_stopped_rank_is_named_by_every_survivor(size, tmp_path):
    victim = size - 1 if size == 2 else 1
    results = run_ranks(_frozen_rank, size, args=(victim, str(tmp_path)), timeout=120)
    for rank, result in enumerate(results):
        print("rank %d: %s" % (rank, result))
        assert result[0] != "completed", (rank, result)
        if rank == victim:
            continue
        _, kind, message, _after = result  # seconds: printed above
        assert kind == "HvdliteInternalError", result  # Aborted, not the transfer timeout
        assert "rank %d (host " % victim in message and "stopped responding" in message, result


def _spinning_rank(seconds):
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(4), name="warm")
    if hvd.rank() == 1:
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # pure Python: holds the GIL the whole time
            pass
    out = hvd.allreduce(np.full(4, float(hvd.rank() + 1)), name="after", op=hvd.Sum)
    hvd.shutdown()
    return out.tolist()


def test_rank_spinning_in_python_is_alive():
    # 12 s of spinning is three times HVDLITE_LIVENESS_SECONDS: rank 0 waits in its allreduce
    # all that time, and the collective completes normally.
    assert run_ranks(_spinning_rank, 2, args=(12.0,), timeout=120) == [[3.0] * 4] * 2
