"""Scale on one host: hvd.init() time, memory, shared memory and sockets per rank against N.

    python benchmarks/scale.py                          # N = 2 8 32 64 128 256, about 5 minutes
    python benchmarks/scale.py --sizes 8 32 64 --before /work/old-tree --torch-max 64
    python benchmarks/scale.py --hosts 4 --torch-max 0     # root: 4 simulated hosts (tests/simhosts.py)

Each job is `python -m hvdlite.runner.launch -np N` of benchmarks/_scale_worker.py (NumPy; every
rank imports hvdlite, waits on a file barrier until all have, then times hvd.init(), a broadcast,
an allgather and 20 steps of a 4 KiB allreduce, and reports what it holds). Side by side in
the same run, at each N up to their limits: --before, another hvdlite tree (built in place:
this script's worker runs with PYTHONPATH set to it), and torch.distributed's
init_process_group on gloo with the same loop (the peer a user would pick; processes started
by hand with torch's variables). Per job: the slowest rank's init, the median RSS per rank,
/dev/shm bytes for the host (the sum of the ranks' own segments), the median and most sockets
per rank, and the median loop time per step. Then the growth exponent of each column between
the two largest sizes measured and by a least-squares fit over N >= 8. Writes
OUT/scale.md and OUT/scale.json (OUT = --out-dir, benchmarks/results); with --hosts K the ranks
are spread evenly over K simulated hosts (network namespaces with their own sshd, reached by
hvdliterun -H over ssh) and the files are scale_hostsK.*. Asserts nothing.
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _report  # noqa: E402

WORKER = os.path.join(HERE, "_scale_worker.py")
PY = sys.executable


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(tree):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_", "OMPI_"))}
    env.update(PYTHONPATH=tree, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return env


def _run_job(kind, n, tree, timeout, cluster=None):
    """One job (on `cluster`'s simulated hosts when given); returns the per-rank results, or
    raises with the job's output."""
    work = tempfile.mkdtemp(prefix="hvd-scale-")
    barrier, out = os.path.join(work, "barrier"), os.path.join(work, "out")
    os.makedirs(barrier)
    os.makedirs(out)
    env = _clean_env(tree)
    try:
        if kind == "torch-gloo":
            port = str(_free_port())
            procs = [
                subprocess.Popen(
                    [PY, WORKER, barrier, out, "torch"],
                    env=dict(env, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for r in range(n)
            ]
            errs = [p.communicate(timeout=timeout)[1] for p in procs]
            failed = any(p.returncode for p in procs)
            log = "\n".join(e for e in errs if e)[-3000:]
        else:
            argv = [PY, "-m", "hvdlite.runner.launch", "-np", str(n)]
            if cluster is not None:
                argv += ["-H", cluster.hosts_arg(n // len(cluster.hosts))]
                env = cluster.client_env(env)
            argv += [PY, WORKER, barrier, out]
            proc = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, timeout=timeout)
            failed, log = proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
        found = []
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as f:
                found.append(json.load(f))
        if failed or len(found) != n:
            raise RuntimeError("%s at N=%d failed:\n%s" % (kind, n, log))
        return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _summary(ranks, hosts=1):
    return {
        "init_s": max(r["init_s"] for r in ranks),
        "rss_mb": statistics.median(r["rss_kb"] for r in ranks) / 1024,
        "shm_host_mb": sum(r["shm_own"] for r in ranks) / 2**20 / hosts,
        "shm_mapped_mb": statistics.median(r["shm_mapped"] for r in ranks) / 2**20,
        "sockets": statistics.median(r["sockets"] for r in ranks),
        "sockets_max": max(r["sockets"] for r in ranks),
        "step_ms": statistics.median(r["loop_s"] for r in ranks) / 20 * 1e3,
    }


def _exponent(points):
    """Least-squares slope of log(value) against log(N) over (N, value) with value > 0."""
    pts = [(math.log(n), math.log(v)) for n, v in points if v > 0]
    if len(pts) < 2:
        return None
    mx = statistics.mean(x for x, _ in pts)
    my = statistics.mean(y for _, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


COLUMNS = [
    ("init_s", "init (s)", "%.2f"),
    ("rss_mb", "RSS/rank (MB)", "%.0f"),
    ("shm_host_mb", "/dev/shm per host (MiB)", "%.1f"),
    ("sockets", "sockets/rank (median)", "%.0f"),
    ("sockets_max", "sockets/rank (most)", "%.0f"),
    ("step_ms", "4 KiB allreduce step (ms)", "%.2f"),
]


def _markdown(results, notes, hosts):
    where = "one host" if hosts == 1 else "%d simulated hosts" % hosts
    lines = ["# Scale on %s (%s)" % (where, time.strftime("%Y-%m-%d")), ""] + notes + [""]
    head = "| library | N | " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines += [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for lib, rows in results.items():
        for n in sorted(rows, key=int):
            cells = [fmt % rows[n][key] for key, _, fmt in COLUMNS]
            lines.append("| %s | %s | %s |" % (lib, n, " | ".join(cells)))
    lines += ["", "Growth exponent (value ~ N^k), least squares over N >= 8:", ""]
    lines += ["| library | " + " | ".join(c[1] for c in COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for lib, rows in results.items():
        ks = []
        for key, _, _ in COLUMNS:
            k = _exponent([(int(n), rows[n][key]) for n in rows if int(n) >= 8])
            ks.append("-" if k is None else "%.2f" % k)
        lines.append("| %s | %s |" % (lib, " | ".join(ks)))
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _hosts(count):
    """None for one host; else a started SimCluster of `count` hosts, closed afterwards."""
    if count == 1:
        yield None
        return
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from simhosts import SimCluster

    with (
        tempfile.TemporaryDirectory(prefix="hvd-scale-hosts-", ignore_cleanup_errors=True) as work,
        SimCluster(work, count) as cluster,
    ):
        yield cluster


def _measure(args, jobs, cluster):
    results = {name: {} for name, _, _ in jobs}
    load = os.getloadavg()[0]
    for n in args.sizes:
        for name, tree, limit in jobs:
            if n > limit or (cluster is not None and (name == "torch-gloo" or n % len(cluster.hosts))):
                continue
            kind = name if name == "torch-gloo" else "hvdlite"
            try:
                hosts = 1 if cluster is None else len(cluster.hosts)
                results[name][str(n)] = _summary(_run_job(kind, n, tree, args.timeout, cluster), hosts)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print("skipped: %s" % e, file=sys.stderr)
                continue
            print(name, n, json.dumps(results[name][str(n)]), flush=True)
    return results, load


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 32, 64, 128, 256])
    ap.add_argument("--before", help="another hvdlite tree, built in place, run beside this one")
    ap.add_argument("--before-max", type=int, default=64, help="largest N for --before")
    ap.add_argument("--torch-max", type=int, default=64, help="largest N for the gloo peer (0: none)")
    ap.add_argument("--hosts", type=int, default=1, help="simulated hosts to spread the ranks over (root)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    jobs = [("hvdlite", ROOT, 10**9)]
    if args.before:
        jobs.append(("hvdlite before", os.path.abspath(args.before), args.before_max))
    if args.torch_max:
        jobs.append(("torch-gloo", ROOT, args.torch_max))
    with _hosts(args.hosts) as cluster:
        results, load = _measure(args, jobs, cluster)
    notes = [
        "This machine: %d CPUs (every simulated host shares them); load average %.2f before the run."
        " One job per cell (a run of N processes on 2 cores is its own repetition: init is the slowest"
        " rank's)." % (os.cpu_count(), load),
        "/dev/shm per host: the sum of every rank's own segment over the hosts (segments are unlinked once mapped,"
        " so this is memory, not names: the blocks each segment's file holds, so the point-to-point arena counts"
        " only as far as it was used), divided by the number of hosts. Sockets: every socket the rank holds (transport, its"
        " listener, the store client).",
    ]
    text = _markdown(results, notes, args.hosts)
    stem = "scale" if args.hosts == 1 else "scale_hosts%d" % args.hosts
    _report.write_outputs(args.out_dir, stem, text, data=results)
    print(text)


if __name__ == "__main__":
    main()
