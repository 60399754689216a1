"""Point-to-point bandwidth: hvd.send / hvd.recv against torch.distributed's gloo send / recv.

Two ranks on this host ping-pong one float32 tensor of each size (rank 0 sends, rank 1
receives and sends it back, rank 0 receives): bandwidth = 2 x bytes / round trip, median
over the repetitions (and the fastest). Both jobs start through _launch.run_job, one after
the other in one invocation, `--rounds` times alternating, and the table gives each
library's median over the rounds, the ratio, and the ratio's range over the rounds. Each
rank runs one compute thread. Every received tensor is checked (the `ok` column).

    python benchmarks/p2p.py [--sizes 65536,1048576,16777216,67108864] [--reps 20] [--rounds 3]
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.abspath(__file__)
sys.path.insert(0, HERE)

from _launch import add_driver_args, available, host_line, run_job  # noqa: E402
from _report import fmt_size, write_outputs  # noqa: E402
from _worker import save_json  # noqa: E402

DEFAULT_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)


def _pingpong(send, recv, rank, nbytes, reps):
    import torch

    x = torch.full((nbytes // 4,), float(rank + 1))
    y = torch.zeros_like(x)
    ok = True
    times = []
    for i in range(reps + 2):  # two warm-ups
        t0 = time.perf_counter()
        if rank == 0:
            send(x, 1)
            recv(y, 1)
            ok = ok and bool(y[0] == 2.0 and y[-1] == 2.0)
        else:
            recv(y, 0)
            send(x, 0)
            ok = ok and bool(y[0] == 1.0 and y[-1] == 1.0)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "ok": ok}


def worker(args):
    import torch

    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.lib == "hvdlite":
        import hvdlite.torch as hvd

        hvd.init()
        rank = hvd.rank()
        send, recv = (lambda t, p: hvd.send(t, p)), (lambda t, p: hvd.recv(t, p))
    else:
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", init_method=os.environ["BENCH_GLOO_INIT"], rank=rank, world_size=2)
        send, recv = (lambda t, p: dist.send(t, p)), (lambda t, p: dist.recv(t, p))
    out = {str(n): _pingpong(send, recv, rank, n, args.reps) for n in sizes}
    if rank == 0:
        save_json(os.path.join(args.out, "rank0.json"), {"sizes": out, "rank": 0})
    if args.lib == "hvdlite":
        hvd.shutdown()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", choices=("hvdlite", "gloo"), help="(set by the driver: run one rank)")
    parser.add_argument("--out", help="(set by the driver: where a rank writes its result)")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    add_driver_args(parser, quick="1 MiB and 16 MiB, 5 repetitions, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.reps, args.rounds = "%d,%d" % (1 << 20, 16 << 20), 5, 1
    return args


def _gbps(nbytes, seconds):
    return 2 * nbytes / seconds / 1e9


def main(argv=None):
    args = parse_args(argv)
    if args.lib:
        worker(args)
        return 0
    libs, skipped = available(["hvdlite", "gloo"])
    rounds = {lib: [] for lib in libs}
    for _ in range(args.rounds):  # alternating, so drift in the machine's load hits both
        for lib in libs:
            docs, error = run_job(
                lib, 2, SCRIPT, ["--sizes=" + args.sizes, "--reps=%d" % args.reps], timeout_s=600
            )
            if error or not docs:
                skipped[lib] = "job failed: %s" % (error or "no result")
            else:
                rounds[lib].append(docs[0]["sizes"])
    lines = [
        "# Point-to-point bandwidth: hvd.send / hvd.recv against torch.distributed gloo send / recv",
        "",
        host_line(),
        "- 2 ranks, ping-pong of one float32 tensor; GB/s = 2 x bytes / round trip (median of %d "
        "repetitions), median over %d alternating rounds; ratio range over the rounds"
        % (args.reps, args.rounds),
    ]
    lines += ["- **%s skipped**: %s" % (k, v) for k, v in skipped.items()]
    lines += [
        "",
        "| size | hvdlite GB/s | gloo GB/s | hvdlite / gloo (range) | ok |",
        "|---|---|---|---|---|",
    ]
    hv, gl = rounds.get("hvdlite", []), rounds.get("gloo", [])
    for n in (int(s) for s in args.sizes.split(",")):
        key = str(n)
        h = [_gbps(n, r[key]["median_s"]) for r in hv]
        g = [_gbps(n, r[key]["median_s"]) for r in gl]
        ok = all(r[key]["ok"] for r in hv + gl)
        ratios = [a / b for a, b in zip(h, g)]
        cell = lambda v: "%.2f" % statistics.median(v) if v else "n/a"  # noqa: E731
        ratio = "%.2f (%.2f-%.2f)" % (statistics.median(ratios), min(ratios), max(ratios)) if ratios else ""
        lines.append(
            "| %s | %s | %s | %s | %s |" % (fmt_size(n), cell(h), cell(g), ratio, "yes" if ok else "NO")
        )
    write_outputs(args.out_dir, "p2p", "\n".join(lines), {"hvdlite": hv, "gloo": gl})
    return 0 if hv and gl else 1


if __name__ == "__main__":
    sys.exit(main())
