"""A real Slurm cluster on one machine, on tests/simhosts.py's simulated hosts: slurmctld in this
namespace (on the cluster's bridge address), one slurmd per simulated host (its own network, host
name and /dev/shm), Debian's slurm-wlm with auth/none (no munge), no cgroups.

    with SimCluster(tmp_path, 2) as hosts, SimSlurm(hosts, tmp_path / "slurm") as slurm:
        subprocess.run(["srun", "-N2", "-n4", "python", "train.py"], env=slurm.env())

Contract: start() raises SlurmUnavailable with the reason where this machine cannot run it (no
slurmctld/slurmd binaries: `apt-get install slurmctld slurmd slurm-client`, or a daemon that
does not come up); every wait is bounded (START_TIMEOUT_S); close() kills the daemons it started
and is idempotent (the simulated hosts' own close() kills whatever is left in their namespaces).
Each node claims CPUS_PER_NODE CPUs, so `srun -N2 -n4` places 2 tasks on each.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import time

START_TIMEOUT_S = 30.0
CPUS_PER_NODE = 2
DAEMONS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo")


class SlurmUnavailable(Exception):
    """This machine cannot run the simulated Slurm cluster; the message says why."""


class SimSlurm:
    def __init__(self, cluster, workdir):
        self.cluster = cluster
        self.workdir = str(workdir)
        self.conf = os.path.join(self.workdir, "slurm.conf")
        self._procs = []
        port = random.randrange(20000, 30000, 2)
        self.ctld_port, self.slurmd_port = port, port + 1

    def env(self, base=None):
        """An environment whose Slurm commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf
        return env

    def _write_conf(self):
        d = self.workdir
        lines = [
            "ClusterName=hvdsim",
            "SlurmctldHost=%s(%s)" % (socket.gethostname(), self.cluster.launcher_addr),
            "SlurmctldPort=%d" % self.ctld_port,
            "SlurmdPort=%d" % self.slurmd_port,
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool-%%n" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd-%%n.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d,
            "SlurmdLogFile=%s/slurmd-%%n.log" % d,
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            # `sbatch --wait` polls the job's state at 2 s, then 8 s, then every 32 s while its
            # interval is under MinJobAge/2 (default 300 s: a 12 s job returns at 42 s). With
            # 0 (job records are never purged: a test cluster holds a handful) it polls every 2 s.
            "MinJobAge=0",
        ]
        for h in self.cluster.hosts:
            lines.append(
                "NodeName=%s NodeAddr=%s CPUs=%d RealMemory=1000 State=UNKNOWN"
                % (h.name, h.addr, CPUS_PER_NODE)
            )
        lines.append("PartitionName=sim Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        os.makedirs(os.path.join(d, "state"), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, argv, log):
        with open(os.path.join(self.workdir, log), "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        self._procs.append(proc)
        return proc

    def _log_tail(self, name):
        try:
            with open(os.path.join(self.workdir, name), errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def _wait_idle(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        out = ""
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise SlurmUnavailable(
                        "%s exited (%d): %s"
                        % (proc.args[0], proc.returncode, self._log_tail("slurmctld.log")[-800:])
                    )
            probe = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30, env=self.env()
            )
            out = probe.stdout + probe.stderr
            states = probe.stdout.split()
            if probe.returncode == 0 and len(states) == len(self.cluster.hosts) and set(states) == {"idle"}:
                return
            time.sleep(0.3)
        raise SlurmUnavailable("the nodes did not become idle within %.0f s: %s" % (START_TIMEOUT_S, out))

    def start(self):
        for tool in DAEMONS:
            if shutil.which(tool) is None:
                raise SlurmUnavailable(
                    "`%s` is not installed (apt-get install slurmctld slurmd slurm-client)" % tool
                )
        os.makedirs(self.workdir, exist_ok=True)
        self._write_conf()
        try:
            self._spawn(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld.out")
            for h in self.cluster.hosts:
                os.makedirs(os.path.join(self.workdir, "spool-%s" % h.name), exist_ok=True)
                # The host's network and name, this machine's mounts: `ip netns exec` gave the
                # host a /sys without the cgroup mounts slurmd insists on.
                nsenter = ["nsenter", "-t", str(h.holder.pid), "-n", "-u"]
                self._spawn(nsenter + ["slurmd", "-D", "-f", self.conf], "slurmd-%s.out" % h.name)
            self._wait_idle()
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self._procs = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
