"""The simulated-hosts harness itself (tests/simhosts.py): separate hosts, reachable, cleaned up."""

import os
import subprocess

import pytest

pytestmark = pytest.mark.slow


def test_hosts_are_separate_and_reachable(simhosts):
    cluster = simhosts(2)
    a, b = cluster.hosts
    seen = {}
    for h in (a, b):
        r = cluster.ssh(h, "hostname; stat -c %d:%i /dev/shm; getent hosts " + b.name)
        assert r.returncode == 0, r.stderr
        name, shm, resolved = r.stdout.split("\n")[:3]
        seen[h.name] = shm
        assert name == h.name
        assert resolved.split()[0] == b.addr
    assert seen[a.name] != seen[b.name], "each host has its own /dev/shm"
    local = os.stat("/dev/shm")
    assert "%d:%d" % (local.st_dev, local.st_ino) not in seen.values()
    # Host a reaches host b's sshd port (the hosts share one bridge).
    r = cluster.ssh(a, "timeout 3 bash -c 'exec 3<>/dev/tcp/%s/22' && echo open" % b.addr)
    assert r.stdout.strip() == "open", r.stderr


def test_close_removes_everything(tmp_path):
    from simhosts import SimCluster, SimHostsUnavailable

    cluster = SimCluster(tmp_path, 2)
    try:
        cluster.start()
    except SimHostsUnavailable as e:
        pytest.skip("simulated hosts unavailable: %s" % e)
    r = cluster.ssh(cluster.hosts[0], "nohup sleep 300 >/dev/null 2>&1 & echo started")
    assert r.stdout.strip() == "started"
    assert len(cluster.hosts[0].pids()) >= 2
    cluster.close()
    assert all(h.pids() == [] for h in cluster.hosts)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert cluster.tag not in netns
    assert cluster.tag not in links
    cluster.close()  # idempotent
