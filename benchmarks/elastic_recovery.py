"""Elastic recovery time: from a worker's SIGKILL (or SIGSTOP) to the survivors' next completed step.

    python benchmarks/elastic_recovery.py [--reps 5] [--hosts localhost:2,127.0.0.2:2] [--freeze]
    python benchmarks/elastic_recovery.py --simhosts 2 --slots 2 [--reps 5]     # root only

Runs tests/elastic_train.py under `hvdliterun --min-np 1 -H HOSTS` once per repetition; in each
run the last worker SIGKILLs itself mid-step (its gradient's allreduce in flight). Recovery =
the last survivor's first step completed in the re-formed job minus the time of the kill
(every process on one machine, simulated hosts included: one clock). --hosts names local
"hosts" (no ssh); --simhosts N builds N simulated hosts (tests/simhosts.py: own network
namespace and sshd each) and every worker starts over ssh. Also reports how long a host added
by the discovery script takes to be training (local hosts only; its first completed step minus
the moment the discovery file changed). --freeze: the worker SIGSTOPs itself instead (it never
exits: the survivors' heartbeat finds it within HVDLITE_LIVENESS_SECONDS, they report it and the
driver kills it); no discovery measurement then. Prints the median and every sample; asserts
nothing about time.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "elastic_train.py")
LINE = re.compile(r"^\[([^\]]+\])\]<stdout>:(.*)$")


def _env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env.update(extra)
    env.setdefault("PYTHONPATH", ROOT)
    return env


def _steps(text):
    """[(worker, step, size, time)] and the kill time."""
    steps, kill = [], None
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        fields = m.group(2).split()
        if fields[0] == "STEP":
            steps.append((m.group(1), int(fields[1]), int(fields[2]), float(fields[4])))
        elif fields[0] in ("KILL", "FREEZE"):
            kill = float(fields[1])
    return steps, kill


def _kill_leftovers(pid_dir):
    """SIGKILLs the workers of a failed run still there (a stopped one never exits)."""
    for name in os.listdir(pid_dir):
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                if b"elastic_train.py" in f.read():
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass


def recovery_once(hosts, victim, size, wrap_env=None, how="KILL"):
    env = _env({"ELASTIC_STEPS": "60", "ELASTIC_SLEEP": "0.02", "ELASTIC_" + how: victim + ":30"})
    if wrap_env is not None:
        env = wrap_env(env)
    cmd = [sys.executable, "-m", "hvdlite.runner.launch", "-np", str(size), "--min-np", "1", "-H", hosts]
    with tempfile.TemporaryDirectory() as pid_dir:
        env["ELASTIC_PID_DIR"] = pid_dir
        try:
            res = subprocess.run(
                cmd + [sys.executable, SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
            )
        finally:
            _kill_leftovers(pid_dir)
    if res.returncode != 0:
        raise SystemExit("run failed:\n" + res.stderr[-3000:])
    steps, kill = _steps(res.stdout)
    survivors = {w for w, _, s, _ in steps if s < size}
    firsts = [min(t for w2, _, s, t in steps if w2 == w and s < size) for w in survivors]
    return max(firsts) - kill, len(survivors)


def join_once():
    with tempfile.TemporaryDirectory() as tmp:
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost\n127.0.0.1\n")
        script = os.path.join(tmp, "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % hosts)
        os.chmod(script, 0o755)
        env = _env({"ELASTIC_STEPS": "400", "ELASTIC_SLEEP": "0.02"})
        cmd = [sys.executable, "-m", "hvdlite.runner.launch", "-np", "2", "--min-np", "2", "--max-np", "3"]
        proc = subprocess.Popen(
            cmd + ["--host-discovery-script", script, sys.executable, SCRIPT],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        added_at, joined_at = None, None
        for line in proc.stdout:
            m = LINE.match(line.rstrip("\n"))
            if not m or not m.group(2).startswith("STEP"):
                continue
            if added_at is None:
                with open(hosts, "w") as f:
                    f.write("localhost\n127.0.0.1\n127.0.0.2\n")
                added_at = time.time()
            elif m.group(1) == "127.0.0.2[0]":
                joined_at = float(m.group(2).split()[4])
                break
        proc.kill()
        proc.wait()
        return joined_at - added_at


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--hosts", default="localhost:2,127.0.0.2:2")
    parser.add_argument("--simhosts", type=int, default=0, help="N simulated hosts instead of --hosts")
    parser.add_argument("--slots", type=int, default=2, help="slots per simulated host")
    parser.add_argument("--freeze", action="store_true", help="the worker SIGSTOPs itself instead")
    args = parser.parse_args()
    if args.simhosts:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from simhosts import SimCluster

        with tempfile.TemporaryDirectory() as tmp, SimCluster(tmp, args.simhosts) as cluster:
            args.hosts = cluster.hosts_arg(args.slots)
            _recovery(args, cluster.client_env)
        return
    _recovery(args)
    if args.freeze:
        return
    joins = [join_once() for _ in range(min(args.reps, 3))]
    print(
        "host added by discovery -> its first training step: median %.3f s  samples %s"
        % (statistics.median(joins), " ".join("%.3f" % s for s in joins))
    )


def _recovery(args, wrap_env=None):
    slots = [int(h.rpartition(":")[2]) for h in args.hosts.split(",")]
    size = sum(slots)
    last_host = args.hosts.split(",")[-1].rpartition(":")[0]
    victim = "%s[%d]" % (last_host, slots[-1] - 1)
    samples = []
    for _ in range(args.reps):
        seconds, survivors = recovery_once(
            args.hosts, victim, size, wrap_env, "FREEZE" if args.freeze else "KILL"
        )
        samples.append(seconds)
    print(
        "%s of %s (%d ranks on %s) -> survivors' next step (%d survivors, no restarts): "
        "median %.3f s  samples %s"
        % (
            "SIGSTOP" if args.freeze else "SIGKILL",
            victim,
            size,
            args.hosts,
            survivors,
            statistics.median(samples),
            " ".join("%.3f" % s for s in samples),
        )
    )


if __name__ == "__main__":
    main()
