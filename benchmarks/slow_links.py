"""Gradient compression and DiLoCo on slow links: simulated hosts whose links are shaped with
tc, every method side by side in one job per (model, hosts, link), beside torch DDP (gloo)
plain and with torch's PowerSGD hook.

    sudo python benchmarks/slow_links.py --goal            # the MLP goal run: 2 hosts, 1 Gbit, 200 steps
    sudo python benchmarks/slow_links.py                   # sweep: mlp,cnn,gpt x 2,4 hosts x 10gbit,1gbit,100mbit
    sudo python benchmarks/slow_links.py --quick           # a smoke sweep: 2 hosts, 1 Gbit, few steps
    sudo python benchmarks/slow_links.py --hierarchy       # 2 hosts x 2 ranks: compress all vs cross-host only

Needs root (tests/simhosts.py: network namespaces, sshd); each host's link is shaped both ways
with `tc ... tbf rate RATE`. Bytes are counted on the links themselves (the hosts' network
namespaces' interface counters over the training loop). Per method: wall time of the loop and
its ratio to the uncompressed run (median over --rounds, with the spread), bytes and their
ratio, time to the target loss (the uncompressed run's smoothed loss at 60% of its steps),
held-out accuracy, replicas identical. Writes OUT/slow_links.{md,json,png} (the plot: loss
against wall time per link speed). Never asserts a time. DeepSpeed's 1-bit Adam is not run:
docs/compression.md says why.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)
from _report import write_outputs  # noqa: E402
from _slow_links_report import plot, table  # noqa: E402

WORKER = os.path.join(HERE, "_slow_links_worker.py")
METHODS = "none,fp16,bf16,powersgd,topk,sign,diloco,ddp,ddp-powersgd"
HIERARCHY = "none,powersgd-flat,powersgd,topk-flat,topk,sign-flat,sign"
STEPS = {"mlp": 200, "cnn": 200, "gpt": 200}


def _terminate(signum, frame):
    raise SystemExit("slow_links: terminated (signal %d)" % signum)


def shape(cluster, rate):
    for h in cluster.hosts:
        tbf = ["tbf", "rate", rate, "burst", "1mb", "latency", "50ms"]
        subprocess.run(["tc", "qdisc", "add", "dev", h.veth_root, "root", *tbf], check=True)
        ns = ["ip", "netns", "exec", h.netns]
        subprocess.run([*ns, "tc", "qdisc", "add", "dev", h.veth_host, "root", *tbf], check=True)


def run_case(model, hosts, per_host, rate, methods, args):
    """One job on `hosts` simulated hosts (`per_host` ranks each) with links at `rate`;
    returns the worker's result document, or {"error": ...}."""
    from simhosts import SimCluster

    with tempfile.TemporaryDirectory() as tmp, SimCluster(tmp, hosts) as cluster:
        shape(cluster, rate)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_", "MASTER_"))}
        env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.update(args.env)
        n = hosts * per_host
        cmd = [
            sys.executable,
            "-m",
            "hvdlite.runner.launch",
            "-np",
            str(n),
            "-H",
            cluster.hosts_arg(per_host),
        ]
        cmd += [sys.executable, WORKER, "--model", model, "--methods", methods, "--out", tmp]
        cmd += ["--steps", str(args.steps or STEPS[model]), "--rounds", str(args.rounds)]
        if "ddp" in methods:
            cmd += ["--gloo", "%s:29533" % cluster.hosts[0].addr]
        print("== %s, %d hosts x %d, %s: %s" % (model, hosts, per_host, rate, methods), flush=True)
        log = os.path.join(tmp, "job.log")
        with open(log, "w") as f:
            try:
                code = subprocess.run(
                    cmd, env=cluster.client_env(env), stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout
                ).returncode
            except subprocess.TimeoutExpired:
                code = "timeout after %d s" % args.timeout
        with open(log) as f:
            text = f.read()
        print("\n".join(line for line in text.splitlines() if " round " in line), flush=True)
        path = os.path.join(tmp, "result.json")
        if code != 0 or not os.path.exists(path):
            return {"error": "exit %s: %s" % (code, text[-3000:])}
        with open(path) as f:
            doc = json.load(f)
    doc.update(hosts=hosts, per_host=per_host, rate=rate)
    return doc


def cases(args):
    """(model, hosts, ranks per host, rate, methods) of the chosen mode."""
    if args.goal:
        return [("mlp", 2, 1, "1gbit", args.methods or METHODS)]
    if args.hierarchy:
        return [("mlp", 2, 2, "1gbit", args.methods or HIERARCHY)]
    out = []
    for model in args.models.split(","):
        for hosts in (int(h) for h in args.hosts.split(",")):
            for rate in args.rates.split(","):
                out.append((model, hosts, 1, rate, args.methods or METHODS))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--goal", action="store_true", help="the MLP goal run: 2 hosts, 1 Gbit")
    mode.add_argument(
        "--hierarchy", action="store_true", help="2 hosts x 2 ranks: cross-host-only compression"
    )
    mode.add_argument("--quick", action="store_true", help="a smoke sweep: 2 hosts, 1 Gbit, 30 steps")
    p.add_argument("--models", default="mlp,cnn,gpt")
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--rates", default="10gbit,1gbit,100mbit")
    p.add_argument("--methods", default="", help="comma list (default: all)")
    p.add_argument("--steps", type=int, default=0, help="training steps (default: 200)")
    p.add_argument("--rounds", type=int, default=1, help="runs of every method, alternating the order")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per job")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.env = {}
    signal.signal(signal.SIGTERM, _terminate)  # the simulated hosts are cleaned up on the way out
    if args.quick:
        args.models, args.hosts, args.rates, args.steps = "mlp,gpt", "2", "1gbit", args.steps or 30
    if os.geteuid() != 0:  # reported, not failed: the suite runs on machines without root too
        write_outputs(args.out_dir, "slow_links", "slow_links: not run, simulated hosts need root")
        return 0
    docs = [run_case(*case, args) for case in cases(args)]
    stem = "slow_links"
    text = table(docs, args.rounds)
    write_outputs(args.out_dir, stem, text, data={"cases": docs}, plot=lambda path: plot(docs, path))
    return 1 if any("error" in d for d in docs) else 0


if __name__ == "__main__":
    sys.exit(main())
