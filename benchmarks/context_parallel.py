"""Context-parallel attention (hvd.parallel.context_parallel_attention) against cp=1:

    python benchmarks/context_parallel.py [--cps 1,2,4] [--seq 2048] [--heads 8] [--kv-heads 4]
        [--dim 64] [--batch 1] [--reps 5] [--budget-mib 64] [--causal]

For each cp (a job of cp ranks under hvdliterun, every rank one context-parallel member) and
each mode (ulysses, allgather, and ring where hvdlite has point-to-point), three measurements:

- activation memory per rank: the bytes autograd saves for backward in one attention call
  (torch.autograd.graph.saved_tensors_hooks, distinct storages), the max over ranks;
- the longest sequence that fits --budget-mib of saved activations per rank: saved bytes are
  measured at two lengths (--seq/4 and --seq/2), and, being affine in the length, solved for the
  budget (stated as an extrapolation in the report);
- throughput, forward + backward at --seq: per repetition (after a barrier) the max over ranks,
  the median over --reps repetitions after one warm-up; against "compute-only", the time the same
  call spent in the attention arithmetic itself (cp/blocks.py's block kernels, merges and masks, timed
  on every rank, max over ranks), i.e. the call with free communication. The ratio
  compute-only / total is the mode's efficiency (median over repetitions, and its range); the
  goal for ring is >= 0.85 at cp=2 and 4.

One compute thread per rank (torch.set_num_threads(1)). On a 2-core machine cp=4 oversubscribes
the cores: its absolute times mean little, its ratios (both sides oversubscribed alike) still do.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def _saved_bytes(fn):
    """Bytes of the distinct storages autograd saves while fn() runs."""
    import torch

    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _timed_kernels(spent):
    """Wraps cp_math's arithmetic so that its wall time adds up in spent[0]."""
    from hvdlite.torch.parallel.cp import blocks as cp_math

    for name in ("block_forward", "block_backward", "merge", "allowed"):
        inner = getattr(cp_math, name)

        def wrapper(*a, _inner=inner, **kw):
            t = time.perf_counter()
            try:
                return _inner(*a, **kw)
            finally:
                spent[0] += time.perf_counter() - t

        setattr(cp_math, name, wrapper)


def worker(args):
    import torch

    import hvdlite.torch as hvd
    from hvdlite.torch.parallel.cp import ring as cp_ring

    torch.set_num_threads(1)
    hvd.init()
    ps, P = hvd.global_process_set, hvd.parallel
    spent = [0.0]
    _timed_kernels(spent)
    modes = ["ulysses", "allgather"] + (["ring"] if cp_ring.available() else [])
    if args.modes:
        modes = [m for m in modes if m in args.modes.split(",")]

    def inputs(seq):
        g = torch.Generator().manual_seed(1)
        shapes = [
            (args.batch, h, seq, args.dim) for h in (args.heads, args.kv_heads, args.kv_heads, args.heads)
        ]
        full = [torch.randn(s, generator=g) for s in shapes]
        return [P.cp_shard(t, 2, ps, args.causal).contiguous() for t in full]

    def call(mode, q, k, v, probe):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        out = P.context_parallel_attention(q, k, v, causal=args.causal, process_set=ps, mode=mode)
        out.backward(probe)

    result = {}
    for mode in modes:
        memory = []
        for seq in (args.seq // 4, args.seq // 2):
            q, k, v, _ = inputs(seq)
            grads = [t.clone().requires_grad_() for t in (q, k, v)]
            mine = _saved_bytes(
                lambda g=grads, m=mode: P.context_parallel_attention(
                    *g, causal=args.causal, process_set=ps, mode=m
                )
            )
            memory.append(hvd.allreduce(torch.tensor([float(mine)]), op=hvd.Max, name="mem").item())
        q, k, v, probe = inputs(args.seq)
        call(mode, q, k, v, probe)  # warm-up
        totals, kernels = [], []
        for _ in range(args.reps):
            hvd.barrier()
            spent[0] = 0.0
            t = time.perf_counter()
            call(mode, q, k, v, probe)
            both = torch.tensor([time.perf_counter() - t, spent[0]])
            worst = hvd.allreduce(both, op=hvd.Max, name="time")
            totals.append(worst[0].item())
            kernels.append(worst[1].item())
        result[mode] = {"memory": memory, "total": totals, "kernel": kernels}
    rank = hvd.rank()
    hvd.shutdown()
    return result if rank == 0 else None  # every rank holds the max over ranks


def _run(cp, passthrough):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "hvdlite.runner.launch", "-np", str(cp), sys.executable, HERE, "--worker"]
    res = subprocess.run(cmd + passthrough, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in res.stdout.splitlines() if "RESULT " in line]
    if res.returncode != 0 or not lines:
        raise RuntimeError("cp=%d failed:\n%s%s" % (cp, res.stdout[-3000:], res.stderr[-3000:]))
    return json.loads(lines[0].split("RESULT ", 1)[1])


def _longest(memory, args):
    """The sequence length whose saved bytes reach the budget (affine fit of two measurements)."""
    (s1, m1), (s2, m2) = (args.seq // 4, memory[0]), (args.seq // 2, memory[1])
    per_token = (m2 - m1) / (s2 - s1)
    return int(s1 + (args.budget_mib * 2**20 - m1) / per_token) if per_token > 0 else None


def report(runs, args):
    print(
        "Context-parallel attention, batch %d, %d heads (%d key heads), head_dim %d, %s, fwd+bwd, "
        "1 thread per rank, median of %d"
        % (
            args.batch,
            args.heads,
            args.kv_heads,
            args.dim,
            "causal" if args.causal else "non-causal",
            args.reps,
        )
    )
    print()
    print("| cp | mode | saved MiB/rank at %d | vs cp=1 | longest seq in %d MiB* | tokens/s | "
          "compute-only tokens/s | efficiency |" % (args.seq // 2, args.budget_mib))  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    # cp=1 runs every mode as the same one-process attention: one row, the baseline of each mode.
    base = next(iter(runs[1].values())) if 1 in runs else None
    for cp, modes in sorted(runs.items()):
        for mode, r in modes.items():
            if cp == 1 and r is not base:
                continue
            total, kernel = statistics.median(r["total"]), statistics.median(r["kernel"])
            tokens = args.batch * args.seq
            ratio = "%.2f" % (r["memory"][1] / base["memory"][1]) if base else "-"
            eff = sorted(k / t for k, t in zip(r["kernel"], r["total"]))
            print(
                "| %d | %s | %.1f | %s | %s | %.0f | %.0f | %.2f (%.2f-%.2f) |"
                % (cp, "(one process)" if cp == 1 else mode, r["memory"][1] / 2**20, ratio,
                   _longest(r["memory"], args), tokens / total, tokens / kernel, statistics.median(eff),
                   eff[0], eff[-1])
            )  # fmt: skip
    print()
    print("* extrapolated: saved bytes measured at %d and %d tokens, affine in the length."
          % (args.seq // 4, args.seq // 2))  # fmt: skip
    if not any("ring" in m for m in runs.values()):
        print("ring: not measured, this build of hvdlite has no point-to-point (hvd.send_async).")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--cps", default="1,2,4")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--budget-mib", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--modes", default="", help="comma-separated subset of ulysses,allgather,ring")
    args = parser.parse_args()
    if args.worker:
        result = worker(args)
        if result is not None:
            print("RESULT " + json.dumps(result), flush=True)
        return
    passthrough, skip = [], False
    for a in sys.argv[1:]:
        if not skip and not a.startswith("--cps"):
            passthrough.append(a)
        skip = a == "--cps"
    cps = [int(c) for c in args.cps.split(",")]
    report({cp: _run(cp, passthrough) for cp in cps}, args)


if __name__ == "__main__":
    main()
