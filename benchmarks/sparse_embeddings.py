"""Step time and bytes sent of a DLRM with 26 embedding tables, 2 ranks, one compute thread each:
hvdlite's sharded tables (planner, and every table row-sharded) against Horovod's sparse path
(replicated tables, sparse gradients allgathered) and sparse_as_dense (tables allreduced whole).

    python benchmarks/sparse_embeddings.py [--steps 20] [--batch 512] [--max-rows 100000] [--ranks 2] [--quick]
        [--torchrec-python /work/venv-torchrec/bin/python] [--rounds 3] [--hosts 4 --ranks 4 --modes sharded]
        [--ranks 4 --modes ps ps-replicated --rounds 3]   (the parameter servers' replicas' cost)

Model and data: examples/dlrm_sparse.py (13 dense features, 26 power-law categorical features,
tables log-spaced from --min-rows to --max-rows rows x --dim), SGD everywhere, fwd + bwd + update.
All rows run here, one after the other, in one invocation; each row is a fresh job of
benchmarks/_sparse_worker.py (its docstring says how bytes are counted). Per step the max over
ranks; the table shows the median and min over --steps steps, and each row's median relative to
the sharded row (of the same round: --rounds R runs every mode once per round, in turn, and adds
each mode's median over the rounds with its range and its ratios to sharded). The allgather row
is Horovod 0.28.1's torch sparse path (per table, allgathers of the uncoalesced gradient's indices
and values started as backward makes it; _sparse_worker.py's HorovodSparseGradients) on hvdlite's
collectives; Horovod itself is not built here. TorchRec runs in an interpreter of its own (--torchrec-python: a venv
whose torch matches its fbgemm-gpu-cpu; this repository's torch 2.13 loads fbgemm-gpu-cpu 1.8.0,
not 1.9.0, docs/sparse.md) as benchmarks/_torchrec_worker.py over torch.distributed gloo; without
the option it has no row. --hosts K (root) runs each hvdlite mode on one host and on K simulated
hosts (tests/simhosts.py: network namespaces with their own sshd and /dev/shm, hvdliterun -H over
ssh, so ranks on different hosts talk TCP) alternately, --rounds times, and adds their ratio.
"""

import argparse
import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, add_driver_args, host_line, run_job, unavailable
from _report import fmt_others, write_outputs

WORKER = os.path.join(HERE, "_sparse_worker.py")
TORCHREC_WORKER = os.path.join(HERE, "_torchrec_worker.py")
MODES = ("sharded", "sharded-row", "allgather", "dense", "torchrec", "ps", "ps-replicated")


def run_row(mode, args, cluster=None):
    """One job of `mode`; on `cluster`'s simulated hosts (ranks spread evenly) when given."""
    extra = ["--mode", mode, "--steps", str(args.steps), "--idle-wait", str(args.idle_wait)]
    extra += ["--batch", str(args.batch), "--dim", str(args.dim)]
    extra += ["--min-rows", str(args.min_rows), "--max-rows", str(args.max_rows)]
    if mode == "torchrec":
        docs, error = run_job(
            "gloo", args.ranks, TORCHREC_WORKER, extra, timeout_s=1200, python=args.torchrec_python
        )
    elif cluster is not None:
        hosts = ["-H", cluster.hosts_arg(args.ranks // len(cluster.hosts))]
        env = {"PATH": cluster.client_env()["PATH"]}
        docs, error = run_job(
            "hvdlite", args.ranks, WORKER, extra, timeout_s=1200, env=env, launch_args=hosts
        )
        mode = "%s, %d hosts" % (mode, len(cluster.hosts))
    else:
        docs, error = run_job("hvdlite", args.ranks, WORKER, extra, timeout_s=1200)
    if error or len(docs) != args.ranks:
        return {"mode": mode, "error": error or "%d of %d ranks wrote results" % (len(docs), args.ranks)}
    per_step = sorted(max(d["times"][i] for d in docs) for i in range(args.steps))
    return {
        "mode": mode,
        "median_s": per_step[len(per_step) // 2],
        "min_s": per_step[0],
        "max_s": per_step[-1],
        "sent": None if docs[0]["sent"] is None else max(d["sent"] for d in docs),
        "version": docs[0].get("torchrec"),
        "table_bytes": max(d["table_bytes"] for d in docs),
        "others": docs[0]["load"]["others"] if docs[0].get("load") else None,
        # CPU time of both ranks' processes (every thread) per step, timed window: the work a
        # step costs, which others' load changes far less than it changes the step time
        "ranks_cpu_s": docs[0]["load"]["ranks_cpu_s"] / args.steps if docs[0].get("load") else None,
    }


def table(results):
    """One line per row; "vs sharded" against the sharded row of the same round."""
    bases = {r.get("round"): r["median_s"] for r in results if r["mode"] == "sharded" and "median_s" in r}
    lines = [
        "| mode | median step | min / max step | vs sharded | ranks' CPU / step | sent / rank / step | tables / rank | others |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "median_s" not in r:
            lines.append("| %s | error: %s | | | | | | |" % (r["mode"], r["error"].replace("|", "/")))
            continue
        base = bases.get(r.get("round"))
        lines.append(
            "| %s | %.1f ms | %.1f / %.1f ms | %s | %s | %s | %.1f MB | %s |"
            % (
                r["mode"] if r.get("round") is None else "%s, round %d" % (r["mode"], r["round"]),
                r["median_s"] * 1e3,
                r["min_s"] * 1e3,
                r["max_s"] * 1e3,
                "%.2fx" % (r["median_s"] / base) if base else "",
                "%.1f ms" % (r["ranks_cpu_s"] * 1e3) if r.get("ranks_cpu_s") is not None else "",
                "not counted" if r["sent"] is None else "%.2f MB" % (r["sent"] / 1e6),
                r["table_bytes"] / 1e6,
                fmt_others(r["others"]) if r["others"] is not None else "",
            )
        )
    return lines


def summary(results):
    """Per mode over the rounds: the median of its round medians with their range, and its
    ratio to the sharded row of the same round (median and range)."""
    lines = [
        "| mode | median of %d rounds | range | vs sharded, same round: median (range) |"
        % len({r["round"] for r in results}),
        "|---|---|---|---|",
    ]
    sharded = {r["round"]: r["median_s"] for r in results if r["mode"] == "sharded" and "median_s" in r}
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = [r for r in results if r["mode"] == mode and "median_s" in r]
        if not rows:
            continue
        times = sorted(r["median_s"] for r in rows)
        ratios = sorted(r["median_s"] / sharded[r["round"]] for r in rows if r["round"] in sharded)
        lines.append(
            "| %s | %.1f ms | %.1f-%.1f ms | %s |"
            % (
                mode,
                times[len(times) // 2] * 1e3,
                times[0] * 1e3,
                times[-1] * 1e3,
                "%.2fx (%.2f-%.2fx)" % (ratios[len(ratios) // 2], ratios[0], ratios[-1]) if ratios else "",
            )
        )
    return lines


def alternating_rounds(args):
    """Every mode once per round, in order, --rounds rounds (peers side by side, alternating)."""
    results = []
    for r in range(args.rounds):
        for mode in args.modes:
            results.append(dict(run_row(mode, args), round=r + 1))
    return results


@contextlib.contextmanager
def simulated_hosts(count):
    """A started tests/simhosts.SimCluster of `count` hosts (root), closed afterwards."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from simhosts import SimCluster

    with (
        tempfile.TemporaryDirectory(prefix="hvd-sparse-hosts-", ignore_cleanup_errors=True) as work,
        SimCluster(work, count) as cluster,
    ):
        yield cluster


def hosts_rounds(args):
    """--hosts K: each hvdlite mode on one host and on K simulated hosts, alternately, --rounds
    times; returns (every row, the ratio table's lines)."""
    modes = [m for m in args.modes if m != "torchrec"]
    rows, lines = [], ["| mode | round | one host | %d hosts | ratio |" % args.hosts, "|---|---|---|---|---|"]
    with simulated_hosts(args.hosts) as cluster:
        for r in range(args.rounds):
            for mode in modes:
                one, many = run_row(mode, args), run_row(mode, args, cluster)
                rows += [one, many]
                if "median_s" in one and "median_s" in many:
                    lines.append(
                        "| %s | %d | %.1f ms | %.1f ms | %.2fx |"
                        % (
                            mode,
                            r + 1,
                            one["median_s"] * 1e3,
                            many["median_s"] * 1e3,
                            many["median_s"] / one["median_s"],
                        )
                    )
    return rows, lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ranks", type=int, default=2, help="more than the cores: bytes only, times mean little")
    p.add_argument("--batch", type=int, default=512, help="examples per rank per step")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--min-rows", type=int, default=10_000)
    p.add_argument("--max-rows", type=int, default=100_000)
    p.add_argument(
        "--modes",
        nargs="+",
        default=None,
        choices=MODES,
        help="default: all (torchrec with --torchrec-python)",
    )
    p.add_argument("--torchrec-python", default=None, help="an interpreter with torchrec and fbgemm-gpu-cpu")
    p.add_argument(
        "--hosts", type=int, default=1, help="also run on K simulated hosts (root; tests/simhosts.py)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of every mode in turn (default 1); with --hosts: one-host / K-host rounds (default 3)",
    )
    add_driver_args(p, idle_wait=10.0, quick="3 steps, small tables, no idle wait")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.max_rows, args.idle_wait = 3, 20_000, 0.0
    reason = unavailable("hvdlite")
    if reason:
        sys.exit("hvdlite cannot run here: " + reason)
    if args.modes is None:
        args.modes = [
            m for m in MODES if (m != "torchrec" or args.torchrec_python) and not m.startswith("ps")
        ]
    if "ps-replicated" in args.modes and args.ranks < 4:
        sys.exit("ps-replicated needs --ranks 4 or more (half of them servers, each with a buddy)")
    if "torchrec" in args.modes and not args.torchrec_python:
        sys.exit("the torchrec row needs --torchrec-python PATH")
    if args.rounds is None:
        args.rounds = 3 if args.hosts > 1 else 1
    if args.hosts > 1:
        results, ratio_lines = hosts_rounds(args)
    elif args.rounds > 1:
        results = alternating_rounds(args)
        ratio_lines = ["", "Over the rounds (each round runs every mode once, in turn):", ""] + summary(
            results
        )
    else:
        results, ratio_lines = [run_row(mode, args) for mode in args.modes], []
    torchrec = next((r.get("version") for r in results if r.get("version")), None)
    text = "\n".join(
        [
            "# Sparse embeddings: DLRM, 26 tables of %d-%d rows x %d, batch %d per rank, %d ranks, SGD"
            % (args.min_rows, args.max_rows, args.dim, args.batch, args.ranks),
            "",
            host_line(),
            "- one compute thread per rank; median, min and max over %d steps of the max over ranks"
            % args.steps,
            "- TorchRec: %s; Horovod: its torch sparse path (uncoalesced allgathers) on hvdlite's collectives"
            " (allgather row), Horovod itself not built"
            % (
                "%s (%s, fused SGD, gloo), bytes not counted" % (torchrec, args.torchrec_python)
                if torchrec
                else "no row (no --torchrec-python)"
            ),
            "",
        ]
        + table(results)
        + (
            ["", "Step time on %d simulated hosts against one host (medians):" % args.hosts, ""] + ratio_lines
            if ratio_lines and args.hosts > 1
            else ratio_lines
        )
    )
    write_outputs(args.out_dir, "sparse_embeddings", text, data=results)


if __name__ == "__main__":
    main()
