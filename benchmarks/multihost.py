"""Allreduce (or allgather: --op allgather) across 2 simulated hosts x 2 ranks with shaped links: hvdlite two-level, hvdlite
flat ring, Open MPI (mpirun -H, mpi4py) and gloo (torch.distributed), side by side.

    sudo python benchmarks/multihost.py                       # 4 Gbit/s links, 4 KiB..64 MiB
    sudo python benchmarks/multihost.py --rate 10gbit --sizes 1M,64M,256M --iters 5
    sudo python benchmarks/multihost.py --only hvdlite --baseline /path/to/other/checkout

Needs root (tests/simhosts.py builds the hosts: network namespaces, sshd); every host's link
is shaped both ways with `tc ... tbf rate RATE`. Prints one table: seconds per allreduce,
busbw (Gbit/s, 2(n-1)/n), and how busy rank 0's host link was while sending (% of RATE).
Never asserts a time. Exit status 1 when a library's job failed (the table says which).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from simhosts import SimCluster  # noqa: E402

WORKER = os.path.join(HERE, "_multihost_worker.py")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
RATES = {"gbit": 1e9, "mbit": 1e6}


def _size(text):
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def _rate(text):
    for unit, mult in RATES.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * mult
    raise SystemExit("--rate like 4gbit or 500mbit")


def _shape(cluster, rate):
    for h in cluster.hosts:
        tbf = ["tbf", "rate", rate, "burst", "1mb", "latency", "50ms"]
        subprocess.run(["tc", "qdisc", "add", "dev", h.veth_root, "root", *tbf], check=True)
        subprocess.run(
            ["ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", h.veth_host, "root", *tbf],
            check=True,
        )


def _jobs(cluster, args, rate_bps):
    common = [sys.executable, WORKER]
    tail = [args.sizes_bytes, str(args.iters), str(rate_bps), args.op]
    run = [sys.executable, "-m", "hvdlite.runner.launch", "-np", "4", "-H", cluster.hosts_arg(2)]
    subnet = cluster.subnet + ".0/24"
    mpirun = ["mpirun", "--allow-run-as-root", "-np", "4", "-H", cluster.hosts_arg(2)]
    mpirun += ["-mca", "plm_rsh_agent", "/usr/bin/ssh -F " + cluster.ssh_config]
    mpirun += ["-mca", "btl_tcp_if_include", subnet, "-mca", "oob_tcp_if_include", subnet, "-x", "PYTHONPATH"]
    gloo = [cluster.hosts[0].addr, "29531"]
    two_level = {"HVDLITE_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_ALLGATHER": "1"}
    flat = {"HVDLITE_HIERARCHICAL_ALLREDUCE": "0", "HVDLITE_HIERARCHICAL_ALLGATHER": "0"}
    jobs = []
    if args.baseline:  # the same two-level job on another checkout's build, run first
        jobs.append(
            (
                "baseline two-level",
                {**two_level, "PYTHONPATH": args.baseline},
                run + common + ["hvdlite"] + tail,
            )
        )
    jobs += [
        ("hvdlite two-level", two_level, run + common + ["hvdlite"] + tail),
        ("hvdlite flat ring", flat, run + common + ["hvdlite"] + tail),
        ("Open MPI (mpi4py)", {}, mpirun + common + ["mpi"] + tail),
        ("gloo (torch)", {}, run + common + ["gloo"] + tail + gloo),
    ]
    return [
        j
        for j in jobs
        if not args.only or j[0].split()[0] in args.only.split(",") or j[0].startswith("baseline")
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="4gbit")
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--op", default="allreduce", choices=("allreduce", "allgather"))
    p.add_argument("--only", default="", help="comma list of libraries to run: hvdlite,Open,gloo")
    p.add_argument("--baseline", default="", help="another checkout (built): adds its two-level job")
    args = p.parse_args()
    rate_bps = _rate(args.rate)
    args.sizes_bytes = ",".join(str(_size(s)) for s in args.sizes.split(","))
    rows, failed = {}, []
    with tempfile.TemporaryDirectory() as tmp, SimCluster(tmp, 2) as cluster:
        _shape(cluster, args.rate)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
        base["PYTHONPATH"] = ROOT
        for label, extra, argv in _jobs(cluster, args, rate_bps):
            res = subprocess.run(
                argv,
                cwd=extra.get("PYTHONPATH", ROOT),
                env=cluster.client_env({**base, **extra}),
                capture_output=True,
                text=True,
                timeout=900,
            )
            got = [
                json.loads(line[line.index("{") :]) for line in res.stdout.splitlines() if '"mode"' in line
            ]
            if not got:
                failed.append(label)
            if res.returncode != 0:  # gloo may abort at exit after its rows were printed
                print("%s exited %d: %s" % (label, res.returncode, res.stderr[-600:]), file=sys.stderr)
            rows[label] = {r["bytes"]: r for r in got}
    print(
        "\n2 simulated hosts x 2 ranks, links shaped to %s; %s float32, %d iterations\n"
        % (args.rate, args.op, args.iters)
    )
    print(
        "| size | "
        + " | ".join("%s s / busbw Gbit/s / link %%" % k for k in rows)
        + " | two-level vs flat | vs Open MPI |"
    )
    print("|---" * (len(rows) + 3) + "|")
    for s in (int(x) for x in args.sizes_bytes.split(",")):
        cells, t = [], {}
        for label, by_size in rows.items():
            r = by_size.get(s)
            t[label] = r["s"] if r else None
            cells.append("%.4f / %.2f / %.0f" % (r["s"], r["busbw_gbit"], 100 * r["link"]) if r else "-")
        h, f, m = t.get("hvdlite two-level"), t.get("hvdlite flat ring"), t.get("Open MPI (mpi4py)")
        ratio = lambda a, b: "%.2fx" % (b / a) if a and b else "-"  # noqa: E731
        print("| %s | %s | %s | %s |" % (s, " | ".join(cells), ratio(h, f), ratio(h, m)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
