"""Elastic training across simulated hosts (tests/simhosts.py: own netns, hostname, /dev/shm,
sshd): the elastic driver starts every worker over ssh, exactly as the multi-host launcher
starts ranks, and its stores listen on the address that reaches the hosts. Runs
tests/elastic_train.py; every test checks that each committed step was done exactly once
(tests/test_elastic.py's checks) and that no process is left on any host."""

import itertools
import os
import subprocess
import sys
import threading
import time

import pytest
from test_elastic import LINE, REPO, SCRIPT, check_exactly_once, worker_lines
from test_multihost import _no_job_left

pytestmark = [pytest.mark.slow, pytest.mark.elastic]

HVDLITERUN = [sys.executable, "-m", "hvdlite.runner.launch"]


def _env(cluster, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return cluster.client_env(env)


def _popen(cluster, *args, **extra):
    return subprocess.Popen(
        HVDLITERUN + [str(a) for a in args] + [sys.executable, SCRIPT],
        cwd=REPO,
        env=_env(cluster, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _follow(proc, on_step, timeout=60):
    """Reads the job's stdout to the end, calling on_step(worker, step, size) for each STEP line;
    the job is killed after `timeout` s. Returns the CompletedProcess."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            m = LINE.match(line.rstrip("\n"))
            if m and m.group(3).startswith("STEP "):
                fields = m.group(3).split()
                on_step(m.group(1), int(fields[1]), int(fields[2]))
        proc.wait(30)
    finally:
        timer.cancel()
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), proc.stderr.read())


def _popen_with_discovery(cluster, tmp_path, first_hosts, steps):
    """An elastic job of 2..4 workers whose discovery script prints the file it returns (first
    holding `first_hosts`), so a test adds hosts by rewriting that file."""
    hosts = tmp_path / "hosts"
    hosts.write_text(first_hosts)
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    proc = _popen(
        cluster,
        "-np",
        2,
        "--min-np",
        2,
        "--max-np",
        4,
        "--host-discovery-script",
        script,
        ELASTIC_STEPS=str(steps),
        ELASTIC_SLEEP="0.03",
    )
    return proc, hosts


def _changes(log):
    sizes = [size for _, size in log]
    return [sizes[0]] + [b for a, b in itertools.pairwise(sizes) if a != b]


def test_worker_killed_on_a_remote_host_survivors_reform_and_finish(simhosts):
    cluster = simhosts(2)
    a, b = cluster.hosts
    victim = "%s[1]" % b.addr
    proc = _popen(
        cluster,
        "-np",
        4,
        "--min-np",
        2,
        "-H",
        cluster.hosts_arg(2),
        ELASTIC_STEPS="30",
        ELASTIC_SLEEP="0.02",
        ELASTIC_KILL=victim + ":8",
    )
    res = _follow(proc, lambda *_: None)
    assert res.returncode == 0, res.stderr[-4000:]
    log = check_exactly_once(res, 30)
    # Horovod's semantics: the failed worker's host is blacklisted, so its other worker leaves;
    # the two workers of the other host go on (step 8 may have completed on 4 ranks).
    assert [size for _, size in log] in ([4] * 8 + [2] * 22, [4] * 9 + [2] * 21), log
    assert "%s was killed by signal 9 (SIGKILL) on its host; blacklisting host %s" % (victim, b.addr) in (
        res.stderr
    ), res.stderr[-4000:]
    assert "generation 2: 2 worker(s): %s[0], %s[1]" % (a.addr, a.addr) in res.stderr
    out = worker_lines(res.stdout)
    # the survivors ran on their own host, never restarted: one process each from step 0 to the end
    for wid in ("%s[0]" % a.addr, "%s[1]" % a.addr):
        steps = [int(line.split()[1]) for line in out[wid] if line.startswith("STEP")]
        assert steps[0] == 0 and steps[-1] == 29 and steps == sorted(set(steps)), (wid, steps)
    assert _no_job_left(cluster) == {}


def test_crashed_host_survivors_on_the_other_host_continue(simhosts):
    cluster = simhosts(2)
    a, b = cluster.hosts
    # No FIN or RST ever comes from a crashed host: the survivors' transports find it silent
    # (HVDLITE_LIVENESS_SECONDS, 4 s) and fail; then they re-form. Default settings throughout.
    proc = _popen(
        cluster,
        "-np",
        4,
        "--min-np",
        2,
        "-H",
        cluster.hosts_arg(2),
        ELASTIC_STEPS="150",
        ELASTIC_SLEEP="0.03",
    )
    crashed = []
    resumed = []

    def on_step(worker, step, size):
        if not crashed and step == 10:
            cluster.crash_host(b)  # link down, every process on it gone: no FIN, no RST
            crashed.append(time.monotonic())
        if crashed and size == 2 and not resumed:
            resumed.append(time.monotonic())

    res = _follow(proc, on_step)
    assert res.returncode == 0, res.stderr[-4000:]
    print("first step on the survivors %.1f s after the crash" % (resumed[0] - crashed[0]))
    log = check_exactly_once(res, 150)
    assert _changes(log) == [4, 2], _changes(log)
    assert "2 worker(s): %s[0], %s[1]" % (a.addr, a.addr) in res.stderr
    assert _no_job_left(cluster) == {}


def test_host_added_by_discovery_script_joins(simhosts, tmp_path):
    cluster = simhosts(2)
    a, b = cluster.hosts
    proc, hosts = _popen_with_discovery(cluster, tmp_path, "%s:2\n" % a.addr, steps=150)
    added = []

    def on_step(worker, step, size):
        if not added and step == 5:
            hosts.write_text("%s:2\n%s:2\n" % (a.addr, b.addr))
            added.append(step)

    res = _follow(proc, on_step)
    assert res.returncode == 0, res.stderr[-4000:]
    log = check_exactly_once(res, 150)
    assert _changes(log) == [2, 4], _changes(log)
    assert "generation 2: 4 worker(s): %s[0], %s[1], %s[0], %s[1]" % (a.addr, a.addr, b.addr, b.addr) in (
        res.stderr
    )
    out = worker_lines(res.stdout)
    # the new workers synced rank 0's state: their first step is the job's next one, not step 0
    joined = [int(line.split()[1]) for line in out["%s[0]" % b.addr] if line.startswith("STEP")]
    assert joined and joined[0] == [size for _, size in log].index(4), joined[:3]
    assert _no_job_left(cluster) == {}


# An elastic worker looks for both of its secrets on every command line of its host.
LEAK = r"""
import os, hvdlite as hvd
hvd.init()
secrets = [os.environ[k].encode() for k in ("HVDLITE_ELASTIC_SECRET", "HVDLITE_SECRET")]
seen = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdline = open("/proc/%s/cmdline" % pid, "rb").read()
    except OSError:
        continue
    seen += sum(s in cmdline for s in secrets)
print("leaks", seen, [len(s) for s in secrets])
"""


def test_secrets_are_on_no_command_line(simhosts):
    cluster = simhosts(2)
    res = subprocess.run(
        HVDLITERUN + ["-np", "2", "--min-np", "2", "-H", cluster.hosts_arg(1), sys.executable, "-c", LEAK],
        cwd=REPO,
        env=_env(cluster),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    lines = sorted(line.split(":", 1)[1] for line in res.stdout.splitlines() if "<stdout>:leaks" in line)
    assert lines == ["leaks 0 [64, 64]"] * 2, res.stdout[-2000:]
    assert _no_job_left(cluster) == {}


def test_remote_host_discovered_while_stores_are_on_loopback_is_ignored(simhosts, tmp_path):
    cluster = simhosts(1)
    # every host local at first: the stores listen on loopback
    proc, hosts = _popen_with_discovery(cluster, tmp_path, "localhost:1\n127.0.0.2:1\n", steps=100)
    added = []

    def on_step(worker, step, size):
        if not added and step == 5:
            hosts.write_text("localhost:1\n127.0.0.2:1\n%s:2\n" % cluster.hosts[0].addr)
            added.append(step)

    res = _follow(proc, on_step)
    assert res.returncode == 0, res.stderr[-4000:]
    assert _changes(check_exactly_once(res, 100)) == [2]
    assert "ignoring remote host %s" % cluster.hosts[0].addr in res.stderr, res.stderr[-4000:]
    assert _no_job_left(cluster) == {}
