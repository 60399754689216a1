"""Simulated hosts on this machine: real network namespaces, hostnames, /dev/shm and sshd.

    with SimCluster(tmp_path, 2) as cluster:      # or the `simhosts` fixture in conftest.py
        env = cluster.client_env()                 # PATH finds an `ssh` that uses cluster's keys
        subprocess.run(["hvdliterun", "-np", "2", "-H", cluster.hosts_arg(1), ...], env=env)

Each host h is:
  - a network namespace `hvdsim-<tag>-<i>` holding one end of a veth pair whose other end is
    on the bridge `hsb<tag>` in the caller's namespace; the bridge has <subnet>.1/24 and the
    host <subnet>.<i + 2>/24, so the caller (the launcher) and every host reach each other;
  - its own UTS namespace (hostname `h.name`) and mount namespace (a private tmpfs on
    /dev/shm, and /etc/hosts bind-mounted to a file naming every simulated host);
  - a real OpenSSH `sshd -D` as the namespaces' first process (the "holder"), listening on
    ports 22 and ALT_SSH_PORT of the host's address, with a per-cluster host key and one
    authorized client key. Processes started through ssh inherit all three namespaces.

Contract: traffic goes only to addresses this cluster created; close() (also on any failure
during start()) kills every process in every host's namespaces, deletes the namespaces, veths
and bridge, and is idempotent. start() raises SimHostsUnavailable with the reason when this
machine cannot build them (not root, no `ip netns`, no unshare, no sshd): the fixture turns that
into a skip. Every wait is bounded (START_TIMEOUT_S).
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import time

SSHD = "/usr/sbin/sshd"
ALT_SSH_PORT = 2222
START_TIMEOUT_S = 15.0


class SimHostsUnavailable(Exception):
    """This machine cannot simulate hosts; the message says why."""


def _run(*argv, check=True):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), proc.returncode, proc.stderr.strip()))
    return proc


def _ns_inode(pid, kind="uts"):
    try:
        return os.readlink("/proc/%d/ns/%s" % (pid, kind))
    except OSError:
        return None


class SimHost:
    def __init__(self, cluster, index):
        self.index = index
        self.name = "sim%s-%d" % (cluster.tag, index)
        self.addr = "%s.%d" % (cluster.subnet, index + 2)
        self.netns = "hvdsim-%s-%d" % (cluster.tag, index)
        self.veth_root = "hsv%s%d" % (cluster.tag, index)
        self.veth_host = "hsp%s%d" % (cluster.tag, index)
        self.holder = None  # Popen of the sshd that holds the namespaces
        self.uts = None  # /proc/<pid>/ns/uts link of the holder: identifies the host's processes

    def pids(self):
        """Every process living in this host's namespaces (the holder sshd included)."""
        if self.uts is None:
            return []
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _ns_inode(int(entry)) == self.uts:
                out.append(int(entry))
        return out

    def job_pids(self):
        """The processes on this host other than its listening sshd: what a job left behind."""
        holder = self.holder.pid if self.holder is not None else -1
        return [p for p in self.pids() if p != holder]

    def cmdline(self, pid):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""


class SimCluster:
    def __init__(self, workdir, num_hosts):
        self.workdir = str(workdir)
        self.tag = "%04x" % random.randrange(0x10000)
        self.subnet = None
        self.hosts = []
        self.num_hosts = num_hosts
        self._bridge = "hsb" + self.tag
        self._made = []  # cleanup actions, run in reverse
        self.key = os.path.join(self.workdir, "client_key")
        self.ssh_config = os.path.join(self.workdir, "ssh_config")
        self.bin_dir = os.path.join(self.workdir, "bin")

    # -- building -----------------------------------------------------------------------------
    def _check_possible(self):
        if os.geteuid() != 0:
            raise SimHostsUnavailable("simulated hosts need root (network namespaces)")
        for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                raise SimHostsUnavailable("`%s` is not installed" % tool)
        if not os.access(SSHD, os.X_OK):
            raise SimHostsUnavailable("%s missing: install openssh-server (`make install` does)" % SSHD)
        probe = _run("unshare", "--uts", "--mount", "true", check=False)
        if probe.returncode != 0:
            raise SimHostsUnavailable("unshare --uts --mount not permitted: %s" % probe.stderr.strip())

    def _pick_subnet(self):
        used = _run("ip", "-o", "-4", "addr").stdout
        for _ in range(50):
            subnet = "10.%d.%d" % (random.randrange(100, 250), random.randrange(0, 250))
            if (" %s." % subnet) not in used:
                return subnet
        raise SimHostsUnavailable("no free 10.x.y.0/24 subnet found")

    def _keys(self):
        os.makedirs(self.bin_dir, exist_ok=True)
        for name in ("client_key", "host_key"):
            path = os.path.join(self.workdir, name)
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdsim", "-f", path)
        shutil.copy(self.key + ".pub", os.path.join(self.workdir, "authorized_keys"))
        with open(self.ssh_config, "w") as f:
            f.write(
                "Host *\n  IdentityFile %s\n  IdentitiesOnly yes\n  BatchMode yes\n"
                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                "  ConnectTimeout 5\n" % self.key
            )
        # The client every launcher finds first on PATH: plain ssh with this cluster's config.
        wrapper = os.path.join(self.bin_dir, "ssh")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nexec /usr/bin/ssh -F %s "$@"\n' % self.ssh_config)
        os.chmod(wrapper, 0o755)
        with open(os.path.join(self.workdir, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n%s.1 simlauncher-%s\n" % (self.subnet, self.tag))
            for h in self.hosts:
                f.write("%s %s\n" % (h.addr, h.name))

    def _sshd_config(self, h):
        path = os.path.join(self.workdir, "sshd_config.%d" % h.index)
        with open(path, "w") as f:
            f.write(
                "Port 22\nPort %d\nListenAddress %s\nHostKey %s\nAuthorizedKeysFile %s\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
                "PrintMotd no\nMaxStartups 200\nMaxSessions 100\nLogLevel ERROR\n"
                % (
                    ALT_SSH_PORT,
                    h.addr,
                    os.path.join(self.workdir, "host_key"),
                    os.path.join(self.workdir, "authorized_keys"),
                )
            )
        return path

    def _add_host(self, h):
        _run("ip", "netns", "add", h.netns)
        self._made.append(lambda: _run("ip", "netns", "del", h.netns, check=False))
        _run("ip", "link", "add", h.veth_root, "type", "veth", "peer", "name", h.veth_host)
        self._made.append(lambda: _run("ip", "link", "del", h.veth_root, check=False))
        _run("ip", "link", "set", h.veth_root, "master", self._bridge, "up")
        _run("ip", "link", "set", h.veth_host, "netns", h.netns)
        nsx = ("ip", "netns", "exec", h.netns)
        _run(*nsx, "ip", "addr", "add", h.addr + "/24", "dev", h.veth_host)
        _run(*nsx, "ip", "link", "set", h.veth_host, "up")
        _run(*nsx, "ip", "link", "set", "lo", "up")
        script = (
            'hostname "$0" && mount -t tmpfs -o size=1g,mode=1777 hvdsimshm /dev/shm && '
            'mount --bind "$1" /etc/hosts && exec %s -D -e -f "$2"' % SSHD
        )
        with open(os.path.join(self.workdir, "sshd.%d.log" % h.index), "wb") as log:
            h.holder = subprocess.Popen(
                [*nsx, "unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", script]
                + [h.name, os.path.join(self.workdir, "hosts"), self._sshd_config(h)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self._made.append(lambda: self._kill_host_processes(h))

    def _wait_ready(self, h):
        """Bounded: until sshd answers on port 22 and the holder has its own UTS namespace."""
        deadline = time.monotonic() + START_TIMEOUT_S
        mine = _ns_inode(os.getpid())
        while time.monotonic() < deadline:
            if h.holder.poll() is not None:
                with open(os.path.join(self.workdir, "sshd.%d.log" % h.index)) as f:
                    raise SimHostsUnavailable("sshd of %s exited: %s" % (h.name, f.read().strip()))
            uts = _ns_inode(h.holder.pid)
            if uts is not None and uts != mine:
                try:
                    with socket.create_connection((h.addr, 22), timeout=1.0):
                        h.uts = uts
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(
            "sshd of %s did not answer on %s:22 within %.0f s" % (h.name, h.addr, START_TIMEOUT_S)
        )

    def start(self):
        self._check_possible()
        self.subnet = self._pick_subnet()
        self.hosts = [SimHost(self, i) for i in range(self.num_hosts)]
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        try:
            self._keys()
            try:
                _run("ip", "link", "add", self._bridge, "type", "bridge")
            except RuntimeError as e:
                raise SimHostsUnavailable("cannot create a bridge: %s" % e) from None
            self._made.append(lambda: _run("ip", "link", "del", self._bridge, check=False))
            _run("ip", "addr", "add", self.subnet + ".1/24", "dev", self._bridge)
            _run("ip", "link", "set", self._bridge, "up")
            for h in self.hosts:
                try:
                    self._add_host(h)
                except RuntimeError as e:
                    if "netns" in str(e) and not self._made[1:]:
                        raise SimHostsUnavailable("network namespaces not permitted: %s" % e) from None
                    raise
            for h in self.hosts:
                self._wait_ready(h)
        except BaseException:
            self.close()
            raise
        return self

    # -- using --------------------------------------------------------------------------------
    @property
    def launcher_addr(self):
        return self.subnet + ".1"

    def hosts_arg(self, slots, hosts=None, names=False):
        """`-H` value: "addr:slots,..." for every host (or those given)."""
        slots_list = slots if isinstance(slots, (list, tuple)) else [slots] * len(hosts or self.hosts)
        return ",".join(
            "%s:%d" % (h.name if names else h.addr, s) for h, s in zip(hosts or self.hosts, slots_list)
        )

    def client_env(self, base=None):
        """An environment whose PATH finds this cluster's ssh wrapper first."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.bin_dir + os.pathsep + env.get("PATH", "")
        return env

    def hosts_file(self):
        """The /etc/hosts every simulated host sees (names of all hosts and of the launcher)."""
        return os.path.join(self.workdir, "hosts")

    def ssh(self, host, command, timeout=20):
        """Runs a shell command on `host` through its sshd; returns the CompletedProcess."""
        return subprocess.run(
            ["/usr/bin/ssh", "-F", self.ssh_config, host.addr, command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def crash_host(self, h):
        """As if the machine lost power: its link goes down (no FIN, no RST ever reaches the
        others) and every process on it dies at once."""
        _run("ip", "link", "set", h.veth_root, "down", check=False)
        self._kill_host_processes(h)

    def _kill_host_processes(self, h):
        for _ in range(20):
            pids = h.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if h.holder is not None:
            try:
                h.holder.kill()
            except ProcessLookupError:
                pass
            try:
                h.holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def close(self):
        made, self._made = self._made, []
        for undo in reversed(made):
            try:
                undo()
            except Exception:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
