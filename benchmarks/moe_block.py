"""Tokens per second of an MoE transformer block (attention + MoE FFN, 8 experts, top-2)
with expert parallelism over 2 ranks against the same block, same global batch, on one
process; and the share of step time spent in all-to-all:

    python benchmarks/moe_block.py [--ranks 2] [--steps 5] [--tokens 512] [--hidden 128] [--loop]

Each step is forward + backward of the block on --tokens tokens per rank (the one-process
run takes ranks x --tokens, all 8 experts), dropless routing. The first step is not timed.
"All-to-all" is the wall time inside the layer's alltoall calls (count exchange, dispatch,
combine, forward and backward) on each rank, which includes waiting for the slower peer;
reported as the max over ranks of (time in all-to-all / step time). One compute thread per
rank (torch.set_num_threads(1)); note the ep=2 run uses two cores where one process uses one.
--loop runs hvdlite's local experts in a Python loop instead of one batched vmap.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
from torch import nn

HERE = os.path.abspath(__file__)


def _ffn(hidden):
    return nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))


class Block(nn.Module):
    """Pre-norm attention + MoE FFN; `moe` maps [b, s, h] to (out, aux, counts)."""

    def __init__(self, hidden, heads, moe):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.moe = moe

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        y, aux, _ = self.moe(self.ln2(x))
        return x + y, aux


def _timed(module, attr, spent):
    """Replaces module.attr by a wrapper adding its wall time to spent[0]."""
    inner = getattr(module, attr)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            spent[0] += time.perf_counter() - t

    setattr(module, attr, wrapper)


def _measure(block, args, rank, size, barrier, spent):
    rows = args.tokens * (1 if size > 1 else args.ranks)
    x = torch.randn(rows // args.seq, args.seq, args.hidden, generator=torch.Generator().manual_seed(rank))

    def step():
        out, aux = block(x)
        (out.square().mean() + aux).backward()

    step()
    times, a2a = [], []
    for _ in range(args.steps):
        barrier()
        spent[0] = 0.0
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        a2a.append(spent[0])
    return {"rank": rank, "size": size, "times": times, "a2a": a2a, "tokens": x.shape[0] * x.shape[1]}


def worker(args):
    import hvdlite.torch as hvd
    from hvdlite.torch import conjugate

    torch.set_num_threads(1)
    hvd.init()
    spent = [0.0]
    _timed(conjugate, "exchange", spent)  # the layer's every alltoall goes through it
    torch.manual_seed(0)
    moe = hvd.parallel.MoE(
        args.hidden, expert=lambda: _ffn(args.hidden), num_experts=args.experts, k=args.k,
        drop_tokens=False, name="bench.moe", batch_experts=False if args.loop else None,
    )  # fmt: skip
    return _measure(Block(args.hidden, 4, moe), args, hvd.rank(), hvd.size(), hvd.barrier, spent)


def worker_deepspeed(args):
    """The same block through deepspeed.moe.layer.MoE on gloo (drop_tokens=False: DeepSpeed
    pads every expert to the largest count over the ranks; no 2nd-expert sampling)."""
    import deepspeed
    import deepspeed.comm as ds_comm
    import torch.distributed as dist
    from deepspeed.moe.layer import MoE as DeepSpeedMoE

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    spent = [0.0]
    _timed(ds_comm, "all_to_all_single", spent)
    torch.manual_seed(0)
    moe = DeepSpeedMoE(
        args.hidden, _ffn(args.hidden), num_experts=args.experts, ep_size=dist.get_world_size(), k=args.k,
        drop_tokens=False, use_rts=False, top2_2nd_expert_sampling=False,
    )  # fmt: skip
    moe.set_deepspeed_parallelism()
    out = _measure(
        Block(args.hidden, 4, moe), args, dist.get_rank(), dist.get_world_size(), dist.barrier, spent
    )
    dist.destroy_process_group()
    return out


def _run(np_, passthrough):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "hvdlite.runner.launch",
        "-np",
        str(np_),
        sys.executable,
        HERE,
        "--worker",
        "hvdlite",
    ]
    res = subprocess.run(cmd + passthrough, env=env, capture_output=True, text=True, timeout=600)
    return _results(np_, [res.stdout], res.stderr)


def _run_deepspeed(np_, passthrough, path):
    """np_ processes of the DeepSpeed worker (torch.distributed env://, gloo), DeepSpeed
    imported from `path` (a throwaway pip --target directory)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, HERE, "--worker", "deepspeed"] + passthrough
    procs = [
        subprocess.Popen(
            cmd,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(np_), LOCAL_WORLD_SIZE=str(np_),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(np_)
    ]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in procs]
    return _results(np_, [o for o, _ in outs], "".join(e for _, e in outs))


def _results(np_, stdouts, stderr):
    lines = [line for text in stdouts for line in text.splitlines() if "RESULT " in line]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in lines]
    if len(results) != np_:
        raise RuntimeError(
            "run on %d ranks produced %d results:\n%s%s" % (np_, len(results), stdouts, stderr[-3000:])
        )
    return results


def _summary(results):
    """(global tokens/s from the median step, where a step is the max over ranks; a2a share)."""
    steps = len(results[0]["times"])
    step_t = sorted(max(r["times"][i] for r in results) for i in range(steps))
    share = max(sum(r["a2a"]) / sum(r["times"]) for r in results)
    tokens = sum(r["tokens"] for r in results)
    return tokens / step_t[steps // 2], step_t[steps // 2], share


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=("hvdlite", "deepspeed"))
    parser.add_argument("--deepspeed-path", help="a directory holding deepspeed (pip install --target)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per rank per step")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--loop", action="store_true", help="hvdlite: local experts in a loop, not batched")
    args = parser.parse_args()
    if args.worker:
        print(
            "RESULT " + json.dumps((worker if args.worker == "hvdlite" else worker_deepspeed)(args)),
            flush=True,
        )
        return
    passthrough = [a for a in sys.argv[1:]]
    one = _summary(_run(1, passthrough))
    ep = _summary(_run(args.ranks, passthrough))
    ds = (
        _summary(_run_deepspeed(args.ranks, passthrough, args.deepspeed_path))
        if args.deepspeed_path
        else None
    )
    print(
        "MoE block: hidden %d, %d experts top-%d (FFN 4x), %d tokens per rank, %d ranks, dropless, "
        "fwd+bwd, median of %d steps, 1 thread per rank"
        % (args.hidden, args.experts, args.k, args.tokens, args.ranks, args.steps)
    )
    print("| layout | global tokens/step | ms/step | tokens/s | all-to-all share |")
    print("|---|---|---|---|---|")
    print(
        "| 1 process, all experts | %d | %.1f | %.0f | %.1f%% |"
        % (args.tokens * args.ranks, one[1] * 1e3, one[0], one[2] * 100)
    )
    print(
        "| ep=%d | %d | %.1f | %.0f | %.1f%% |"
        % (args.ranks, args.tokens * args.ranks, ep[1] * 1e3, ep[0], ep[2] * 100)
    )
    if ds is not None:
        print(
            "| DeepSpeed MoE ep=%d (gloo) | %d | %.1f | %.0f | %.1f%% |"
            % (args.ranks, args.tokens * args.ranks, ds[1] * 1e3, ds[0], ds[2] * 100)
        )
    print("speedup ep=%d / one process: %.2f" % (args.ranks, ep[0] / one[0]))


if __name__ == "__main__":
    main()
