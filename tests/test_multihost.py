"""hvdliterun -H across simulated hosts (tests/simhosts.py: own netns, hostname, /dev/shm, sshd).

Every test here builds its own hosts and tears them down; they skip where this machine cannot
(not root, no sshd). Remote ranks really go through ssh into another network namespace.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
HVDLITERUN = [sys.executable, "-m", "hvdlite.runner.launch"]
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")

# Each rank prints one line: hostname, topology and the checks of a collective suite.
SUITE = r"""
import json, os, socket, sys
import numpy as np
import hvdlite as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
checks = {}
for dt in (np.float32, np.float64, np.int32, np.int64):
    for count in (0, 1, 3 * n + 1, 100003):
        x = (np.arange(count) % 7 + r).astype(dt)
        s = hvd.allreduce(x, op=hvd.Sum, name="s%s%d" % (np.dtype(dt).name, count))
        ref = sum((np.arange(count) % 7 + q).astype(dt) for q in range(n))
        checks["sum_%s_%d" % (np.dtype(dt).name, count)] = bool(np.array_equal(s, ref))
x = np.full(5, float(r))
checks["max"] = bool((hvd.allreduce(x, op=hvd.Max) == n - 1).all())
checks["min"] = bool((hvd.allreduce(x, op=hvd.Min) == 0).all())
checks["avg"] = bool(np.allclose(hvd.allreduce(x, op=hvd.Average), (n - 1) / 2))
g = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int32))
checks["allgather"] = bool(np.array_equal(g, np.concatenate([np.full((q + 1, 2), q) for q in range(n)])))
b = hvd.broadcast(np.arange(4.0) * (r + 1), root_rank=n - 1)
checks["broadcast"] = bool(np.array_equal(b, np.arange(4.0) * n))
splits = [q + 1 for q in range(n)]
a, got = hvd.alltoall(np.concatenate([np.full(q + 1, 100 * r + q) for q in range(n)]), splits=splits)
expect = np.concatenate([np.full(r + 1, 100 * q + r) for q in range(n)])
checks["alltoall"] = bool(np.array_equal(a, expect)) and list(got) == [r + 1] * n
rs = hvd.reducescatter(np.ones((2 * n, 3)) * (r + 1), op=hvd.Sum)
checks["reducescatter"] = rs.shape == (2, 3) and bool((rs == n * (n + 1) / 2).all())
big = hvd.allreduce(np.full(1 << 20, r + 1, dtype=np.float32), op=hvd.Sum)
checks["big"] = bool((big == n * (n + 1) / 2).all())
hvd.barrier()
print(json.dumps({
    "host": socket.gethostname(), "rank": r, "size": n,
    "local": [hvd.local_rank(), hvd.local_size()], "cross": [hvd.cross_rank(), hvd.cross_size()],
    "bad": sorted(k for k, ok in checks.items() if not ok),
}))
"""

# Ranks allreduce in a loop until killed; each writes its pid to DIR/<rank> once running
# (written aside and renamed, so the test never reads a file that exists but is still empty).
LOOP = r"""
import os, sys, time
import numpy as np
import hvdlite as hvd

hvd.init()
path = os.path.join(sys.argv[1], str(hvd.rank()))
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(path + ".tmp", path)
while True:
    hvd.allreduce(np.ones(1000), name="loop")
    time.sleep(0.01)
"""


def _script(tmp_path, text, name):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _env(cluster, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return cluster.client_env(env)


def _run(cluster, *args, timeout=120, **extra):
    return subprocess.run(
        HVDLITERUN + [str(a) for a in args],
        cwd=REPO,
        env=_env(cluster, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _results(res):
    import json

    out = {}
    for line in res.stdout.splitlines():
        m = LINE.match(line)
        if m and m.group(2) == "stdout" and m.group(3).startswith("{"):
            out[int(m.group(1))] = json.loads(m.group(3))
    return out


def _no_job_left(cluster, timeout=15.0):
    """Waits (bounded) until no host runs anything but its sshd; returns what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: [h.cmdline(p) for p in h.job_pids()] for h in cluster.hosts}
        left = {k: v for k, v in left.items() if v}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_two_hosts_two_slots_run_the_collective_suite(simhosts, tmp_path):
    cluster = simhosts(2)
    suite = _script(tmp_path, SUITE, "suite.py")
    res = _run(cluster, "-np", 4, "-H", cluster.hosts_arg(2), "--verbose", sys.executable, suite)
    assert res.returncode == 0, res.stderr[-4000:]
    out = _results(res)
    assert sorted(out) == [0, 1, 2, 3]
    a, b = cluster.hosts
    assert [out[r]["host"] for r in range(4)] == [a.name, a.name, b.name, b.name]
    assert [out[r]["local"] for r in range(4)] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    assert [out[r]["cross"] for r in range(4)] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert [out[r]["bad"] for r in range(4)] == [[]] * 4
    # Shared memory only inside a host: each rank links its one same-host peer, never more.
    assert len(re.findall(r"shared memory with 1 of 1 partners on this host", res.stderr)) == 4, res.stderr[
        -4000:
    ]
    # The suite's large allreduces ran in two levels (HVDLITE_HIERARCHICAL_ALLREDUCE's default).
    assert len(re.findall(r"allreduce in two levels: 2 hosts x 2 ranks", res.stderr)) == 4
    assert _no_job_left(cluster) == {}


def test_three_hosts_uneven_slots_topology_and_suite(simhosts, tmp_path):
    cluster = simhosts(3)
    suite = _script(tmp_path, SUITE, "suite.py")
    res = _run(cluster, "-np", 4, "-H", cluster.hosts_arg([1, 2, 1]), sys.executable, suite)
    assert res.returncode == 0, res.stderr[-4000:]
    out = _results(res)
    h = [x.name for x in cluster.hosts]
    assert [out[r]["host"] for r in range(4)] == [h[0], h[1], h[1], h[2]]
    # Horovod's definitions: cross_rank = index of the host among those with this local_rank.
    assert [out[r]["local"] for r in range(4)] == [[0, 1], [0, 2], [1, 2], [0, 1]]
    assert [out[r]["cross"] for r in range(4)] == [[0, 3], [1, 3], [0, 1], [2, 3]]
    assert [out[r]["bad"] for r in range(4)] == [[]] * 4
    assert _no_job_left(cluster) == {}


def test_hostfile_port_identity_interfaces_and_output_files(simhosts, tmp_path):
    from simhosts import ALT_SSH_PORT

    cluster = simhosts(2)
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(
        "# two hosts\n%s slots=1\n\n%s slots=1\n" % (cluster.hosts[0].addr, cluster.hosts[1].addr)
    )
    # Each host's NIC has another name (Horovod #2431): the first one a host has is used.
    ifaces = ",".join(["hsb" + cluster.tag] + [h.veth_host for h in cluster.hosts])
    code = "import os, hvdlite as hvd; hvd.init(); print('ok', hvd.rank(), hvd.allreduce(1.0, op=hvd.Sum))"
    outdir = tmp_path / "out"
    res = _run(
        cluster,
        "-np", 2, "--hostfile", hostfile, "-p", ALT_SSH_PORT, "-i", cluster.key,
        "--network-interfaces", ifaces, "--start-timeout", 20, "--output-filename", outdir,
        sys.executable, "-c", code,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    for rank in (0, 1):
        assert (outdir / ("rank.%d" % rank) / "stdout").read_text() == "ok %d 2.0\n" % rank
        assert (outdir / ("rank.%d" % rank) / "stderr").exists()


def test_local_hosts_start_without_ssh_and_count_as_two(simhosts, tmp_path):
    cluster = simhosts(1)
    # No ssh on PATH at all: localhost and 127.0.0.1 must not need it. Two distinct hosts.
    env_path = {"PATH": "/nonexistent:" + os.path.dirname(sys.executable)}
    code = "import json, hvdlite as hvd; hvd.init(); print(json.dumps({'local': [hvd.local_rank(), hvd.local_size()], 'cross': [hvd.cross_rank(), hvd.cross_size()]}))"
    res = subprocess.run(
        HVDLITERUN + ["-np", "2", "-H", "localhost:1,127.0.0.1:1", sys.executable, "-c", code],
        cwd=REPO, env={**_env(cluster), **env_path}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    out = _results(res)
    assert out[0] == {"local": [0, 1], "cross": [0, 2]} and out[1] == {"local": [0, 1], "cross": [1, 2]}
    # A local host beside a remote one: the store listens where the remote host reaches it.
    res = _run(
        cluster, "-np", 2, "-H", "127.0.0.1:1,%s:1" % cluster.hosts[0].addr, sys.executable, "-c", code
    )
    assert res.returncode == 0, res.stderr[-4000:]


def test_unreachable_host_is_named(simhosts):
    cluster = simhosts(1)
    dead = cluster.subnet + ".250"  # on the bridge's subnet, nobody there
    res = _run(
        cluster, "-np", 2, "-H", "%s:1,%s:1" % (cluster.hosts[0].addr, dead), sys.executable, "-c", "pass"
    )
    assert res.returncode != 0
    assert "host %s is not reachable over ssh" % dead in res.stderr
    assert cluster.hosts[0].addr + " is not" not in res.stderr
    assert _no_job_left(cluster) == {}


def _start_loop(cluster, tmp_path, slots):
    pids = tmp_path / "pids"
    pids.mkdir()
    loop = _script(tmp_path, LOOP, "loop.py")
    proc = subprocess.Popen(
        HVDLITERUN + ["-np", str(sum(slots)), "-H", cluster.hosts_arg(slots), sys.executable, loop, str(pids)],
        cwd=REPO, env=_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(_written(pids)) < sum(slots) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert len(_written(pids)) == sum(slots), proc.communicate(timeout=30)
    return proc, {int(r): int((pids / r).read_text()) for r in _written(pids)}


def _written(pids):
    """The ranks whose pid file LOOP has finished writing."""
    return [n for n in os.listdir(pids) if not n.endswith(".tmp")]


def test_rank_killed_on_a_remote_host_stops_the_job(simhosts, tmp_path):
    cluster = simhosts(2)
    proc, pids = _start_loop(cluster, tmp_path, [2, 1])
    # Ranks print their pid as seen in their host's namespaces; ours is the same (one pid ns).
    os.kill(pids[2], signal.SIGKILL)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    # Whichever is reaped first is named: rank 2 itself, or a peer that lost its connection to it.
    named = re.search(r"hvdliterun: rank (\d) \(host ([\d.]+)\) (.*); stopping", err)
    assert named, err[-3000:]
    if named.group(1) == "2":
        assert named.group(2) == cluster.hosts[1].addr
        assert named.group(3) == "was killed by signal 9 (SIGKILL) on its host"
    assert _no_job_left(cluster) == {}


def test_host_crash_mid_job_stops_the_job(simhosts, tmp_path):
    cluster = simhosts(2)
    proc, _ = _start_loop(cluster, tmp_path, [1, 1])
    cluster.crash_host(cluster.hosts[1])
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "rank 1 (host %s) lost its ssh connection" % cluster.hosts[1].addr in err, err[-3000:]
    assert _no_job_left(cluster) == {}


def test_launcher_killed_leaves_no_remote_process(simhosts, tmp_path):
    cluster = simhosts(2)
    proc, _ = _start_loop(cluster, tmp_path, [1, 1])
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: ssh's stdin closing must do it
    proc.communicate(timeout=30)
    assert _no_job_left(cluster) == {}


# A rank looks for the job secret on every command line of its host.
LEAK = r"""
import os, hvdlite as hvd
hvd.init()
secret = os.environ["HVDLITE_SECRET"].encode()
seen = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        seen += secret in open("/proc/%s/cmdline" % pid, "rb").read()
    except OSError:
        pass
print("leaks", seen, len(secret))
"""


def test_secret_is_on_no_command_line(simhosts, tmp_path):
    cluster = simhosts(2)
    res = _run(cluster, "-np", 3, "-H", "127.0.0.1:1," + cluster.hosts_arg(1), sys.executable, "-c", LEAK)
    assert res.returncode == 0, res.stderr[-4000:]
    lines = sorted(line.split(":", 1)[1] for line in res.stdout.splitlines() if "<stdout>:leaks" in line)
    assert lines == ["leaks 0 64"] * 3


def test_host_names_resolve_through_etc_hosts(simhosts):
    cluster = simhosts(2)
    # The launcher sees the simulated hosts' names through its own /etc/hosts (a private mount).
    code = "import socket, hvdlite as hvd; hvd.init(); print('on', socket.gethostname(), hvd.allreduce(1.0))"
    argv = HVDLITERUN + ["-np", "2", "-H", cluster.hosts_arg(1, names=True), sys.executable, "-c", code]
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount --bind "$0" /etc/hosts && exec "$@"', cluster.hosts_file(), *argv],
        cwd=REPO, env=_env(cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    assert sorted(line.split(":", 1)[1] for line in res.stdout.splitlines()) == [
        "on %s 1.0" % h.name for h in cluster.hosts
    ]


def test_mpirun_across_hosts(simhosts):
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (Open MPI: make install)")
    cluster = simhosts(2)
    code = (
        "import json, socket, hvdlite as hvd; hvd.init(); "
        "print(json.dumps({'host': socket.gethostname(), 'rank': hvd.rank(), 'sum': float(hvd.allreduce(1.0 + hvd.rank(), op=hvd.Sum)), "
        "'local': [hvd.local_rank(), hvd.local_size()], 'cross': [hvd.cross_rank(), hvd.cross_size()]}))"
    )
    subnet = cluster.subnet + ".0/24"
    res = subprocess.run(
        ["mpirun", "--allow-run-as-root", "-np", "4", "-H", cluster.hosts_arg(2),
         "-mca", "plm_rsh_agent", "/usr/bin/ssh -F " + cluster.ssh_config,
         "-mca", "btl_tcp_if_include", subnet, "-mca", "oob_tcp_if_include", subnet,
         "-x", "PYTHONPATH", "-x", "PATH", sys.executable, "-c", code],
        cwd=REPO, env=_env(cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    import json

    out = sorted(
        (json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")),
        key=lambda o: o["rank"],
    )
    a, b = cluster.hosts
    assert [o["host"] for o in out] == [a.name, a.name, b.name, b.name]
    assert [o["sum"] for o in out] == [10.0] * 4
    assert [o["local"] for o in out] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    assert [o["cross"] for o in out] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert _no_job_left(cluster) == {}
