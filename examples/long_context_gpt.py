"""A small GPT trained on long sequences with context parallelism (hvd.Mesh's cp axis), combined
with data parallelism (dp) and, optionally, tensor parallelism (tp).

    hvdliterun -np 2 python examples/long_context_gpt.py --cp 2                 # cp=2
    hvdliterun -np 4 python examples/long_context_gpt.py --cp 2                 # dp=2 x cp=2
    hvdliterun -np 4 python examples/long_context_gpt.py --cp 2 --tp 2 --dp 1   # cp=2 x tp=2

The corpus is the Python standard library's own source, as bytes; the model predicts the next
byte of sequences of --seq bytes (any length: cp need not divide it). Every rank builds the same
dense model from one seed. Each sequence is split over the cp members with
hvd.parallel.cp_shard (the zigzag layout, since the attention is causal): embeddings, layer
norms and MLPs work on a member's own tokens, and ContextParallelAttention lets every token
attend to every earlier token of the sequence, wherever it lives (--mode: ulysses, allgather,
ring or auto). With --tp, attention heads and MLP columns are split over tp as well.

Each member's loss is the sum over its tokens divided by the tokens of the whole batch, so the
gradients summed over cp (and averaged over dp) are those of the mean loss over every token:
one allreduce over the mesh's ("dp", "cp") set per step. Rank 0 prints the mesh and a progress
bar with the loss.
"""

import argparse

import torch
import torch.nn.functional as F
from pytorch_gpt_3d import load_corpus  # the same corpus (this folder is on sys.path)
from torch import nn
from tqdm import tqdm

import hvdlite.torch as hvd


class Block(nn.Module):
    """Pre-norm transformer block over this member's tokens; attention across the cp set."""

    def __init__(self, args, mesh):
        super().__init__()
        P, tp = hvd.parallel, mesh.process_set("tp")
        d = args.width
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = P.ContextParallelAttention(
            d, args.heads, mesh, num_kv_heads=args.kv_heads, causal=True, mode=args.mode
        )
        self.fc1 = P.ColumnParallelLinear(d, 4 * d, process_set=tp)
        self.fc2 = P.RowParallelLinear(4 * d, d, process_set=tp)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, args, mesh):
        super().__init__()
        torch.manual_seed(0)  # the same dense model everywhere; tp layers keep their slice
        self.tok, self.pos = nn.Embedding(256, args.width), nn.Embedding(args.seq, args.width)
        self.blocks = nn.ModuleList(Block(args, mesh) for _ in range(args.layers))
        self.ln_f, self.head = nn.LayerNorm(args.width), nn.Linear(args.width, 256, bias=False)

    def forward(self, tokens, positions):
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def batch(corpus, args, step, dp_rank):
    """(inputs, next-byte targets), full sequences, of dp replica dp_rank at `step`."""
    g = torch.Generator().manual_seed(step * 1000 + dp_rank)
    starts = torch.randint(0, len(corpus) - args.seq - 1, (args.batch,), generator=g)
    rows = torch.stack([corpus[s : s + args.seq + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--dp", type=int, default=-1)
    parser.add_argument("--mode", default="auto", choices=["auto", "ulysses", "allgather", "ring"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2, help="below --heads: grouped-query attention")
    parser.add_argument("--seq", type=int, default=509, help="bytes per sequence (any length)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per dp replica and step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    mesh = hvd.Mesh(dp=args.dp, cp=args.cp, tp=args.tp)
    if hvd.rank() == 0:
        print(mesh.describe(), flush=True)
    cp, grads_set = mesh.process_set("cp"), mesh.process_set(("dp", "cp"))
    model = GPT(args, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    corpus = load_corpus(args.corpus_bytes)
    positions = hvd.parallel.cp_shard(torch.arange(args.seq), 0, cp, causal=True)
    bar = tqdm(range(args.steps), disable=hvd.rank() != 0, mininterval=0.5)
    first_loss = loss = None
    for step in bar:
        x, y = batch(corpus, args, step, mesh.rank("dp"))
        x, y = (hvd.parallel.cp_shard(t, 1, cp, causal=True) for t in (x, y))
        opt.zero_grad()
        logits = model(x, positions)
        mine = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / (args.batch * args.seq)
        mine.backward()
        grads = [p.grad for p in model.parameters()]
        hvd.grouped_allreduce_(
            grads, op=hvd.Sum, postscale_factor=1.0 / mesh.size("dp"), name="grads", process_set=grads_set
        )
        opt.step()
        total = hvd.allreduce(mine.detach(), op=hvd.Sum, name="loss", process_set=grads_set)
        loss = total.item() / mesh.size("dp")
        first_loss = loss if first_loss is None else first_loss
        bar.set_postfix(loss="%.3f" % loss, refresh=False)
    if hvd.rank() == 0:
        print("loss %.3f -> %.3f after %d steps on %s" % (first_loss, loss, args.steps, mesh), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
