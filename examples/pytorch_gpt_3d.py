"""A small GPT trained with data, tensor and pipeline parallelism at once (hvd.Mesh).

    hvdliterun -np 4 python examples/pytorch_gpt_3d.py                 # pp=2 x tp=2
    hvdliterun -np 8 python examples/pytorch_gpt_3d.py --dp 2          # dp=2 x pp=2 x tp=2
    hvdliterun -np 4 python examples/pytorch_gpt_3d.py --pp 1 --tp 2   # dp=2 x tp=2

The corpus is the Python standard library's own source (bytes of its .py files, so the
vocabulary is the 256 byte values); the model predicts the next byte. Every rank builds the
same dense model from one seed and keeps its part of it:

  - pipeline (pp): the blocks are cut into pp stages, the first with the embeddings and the
    last with the head; Schedule1F1B runs --microbatches microbatches per step;
  - tensor (tp): attention heads and MLP columns are split (ColumnParallelLinear for the qkv
    and first MLP layer, RowParallelLinear after), the byte embedding and the head are
    vocabulary-parallel, and the loss is vocab_parallel_cross_entropy;
  - data (dp, whatever is left): each dp replica draws its own batch; gradients are averaged
    over the dp axis after every step.

Rank 0 prints the mesh and a progress bar with the loss (the mean over dp replicas of the
last pipeline stage's loss).

--elastic runs the loop under hvd.elastic.run with hvd.parallel.MeshState, committing every
step; launch it with the elastic driver, hosts of 2 slots (one tp pair each), e.g.

    hvdliterun -np 8 --min-np 4 -H localhost:2,127.0.0.1:2,127.0.0.2:2,127.0.0.3:2 \
        python examples/pytorch_gpt_3d.py --dp 2 --elastic --kill-rank 5 --kill-step 3

Rank 5 SIGKILLs itself in step 3 (--kill-*: to watch a recovery); the driver drops its host
(ranks 4 and 5: stage 1 of replica 0), the 6 survivors re-form the mesh with dp=1 (one holder per
pipeline and tensor coordinate; the two ranks left over are released and exit 0) and finish on 4
ranks, each now computing both original replicas' batches (gradients accumulated), so the loss
curve is the uninterrupted one's.

With dp=1 no survivor holds a lost rank's shard; MeshState then keeps buddy copies of every
shard (on another host), and a worker the driver starts on a free slot takes the lost coordinate
over (MeshState.join(), restored from the buddy copy), e.g. 4 ranks on 5 one-slot hosts:

    hvdliterun -np 4 --min-np 4 --max-np 4 \
        -H localhost:1,127.0.0.1:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1 \
        python examples/pytorch_gpt_3d.py --elastic --kill-rank 1 --kill-step 3
"""

import argparse
import glob
import itertools
import os
import signal
import sysconfig
import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import hvdlite.torch as hvd


def load_corpus(max_bytes):
    """The standard library's .py files, concatenated in name order, as a uint8 tensor."""
    root = sysconfig.get_paths()["stdlib"]
    data, total = [], 0
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        with open(path, "rb") as f:
            data.append(f.read())
        total += len(data[-1])
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(data)[:max_bytes]), dtype=torch.uint8).long()


class Block(nn.Module):
    """Pre-norm transformer block; heads laid out [head, (q, k, v), head_dim] in the qkv rows
    so that a column split over tp keeps whole heads together."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x))
        local_heads = qkv.shape[-1] // (3 * self.hd)  # heads / tp under tensor parallelism
        q, k, v = qkv.view(b, s, local_heads, 3, self.hd).permute(3, 0, 2, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, local_heads * self.hd))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def to_tensor_parallel(self, tp):
        P = hvd.parallel
        self.qkv = P.ColumnParallelLinear.from_dense(self.qkv, process_set=tp)
        self.proj = P.RowParallelLinear.from_dense(self.proj, process_set=tp)
        self.fc1 = P.ColumnParallelLinear.from_dense(self.fc1, process_set=tp)
        self.fc2 = P.RowParallelLinear.from_dense(self.fc2, process_set=tp)
        return self


class Stage(nn.Module):
    """Blocks [first, last) of the GPT; the first stage embeds, the last one has the head
    (vocabulary-parallel logits)."""

    def __init__(self, args, first, last, n_layers, tp):
        super().__init__()
        torch.manual_seed(0)  # every rank builds the same dense model, then keeps its part
        dense_tok, dense_pos = nn.Embedding(256, args.width), nn.Embedding(args.seq, args.width)
        blocks = [Block(args.width, args.heads) for _ in range(n_layers)]
        dense_head, ln_f = nn.Linear(args.width, 256, bias=False), nn.LayerNorm(args.width)
        P = hvd.parallel
        self.embed = first == 0
        if self.embed:
            self.tok = P.VocabParallelEmbedding.from_dense(dense_tok, process_set=tp)
            self.pos = dense_pos
        self.blocks = nn.ModuleList(b.to_tensor_parallel(tp) for b in blocks[first:last])
        self.head = self.ln_f = None
        if last == n_layers:
            self.head, self.ln_f = P.ColumnParallelLinear.from_dense(dense_head, process_set=tp), ln_f

    def forward(self, x):
        if self.embed:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.head is not None and self.ln_f is not None else x


def batch(corpus, args, step, dp_rank):
    """(inputs, next-byte targets) of dp replica dp_rank at `step`: the same on every rank of
    the replica (its pipeline and tensor-parallel members), different across replicas."""
    g = torch.Generator().manual_seed(step * 1000 + dp_rank)
    starts = torch.randint(0, len(corpus) - args.seq - 1, (args.batch,), generator=g)
    rows = torch.stack([corpus[s : s + args.seq + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="sequences per dp replica and step")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000)
    parser.add_argument("--elastic", action="store_true", help="hvd.elastic.run with MeshState")
    parser.add_argument("--kill-rank", type=int, default=-1, help="--elastic: this rank SIGKILLs itself")
    parser.add_argument("--kill-step", type=int, default=-1, help="... in this step (first generation)")
    parser.add_argument("--no-buddies", action="store_true", help="--elastic: MeshState(buddies=False)")
    parser.add_argument("--print-losses", action="store_true", help="rank 0 prints every step's loss")
    return parser.parse_args()


class Trainer:
    """This rank's part of the 3-D GPT and one training step of it. A step computes the batches
    of the original dp replicas `replicas` (one, unless an elastic job lost some: then this rank
    computes several and their gradients accumulate) and divides the dp sum by `n_replicas`."""

    def __init__(self, args, mesh):
        self.args, self.mesh = args, mesh
        self.tp, self.dp, pp = mesh.process_set("tp"), mesh.process_set("dp"), mesh.process_set("pp")
        self.n_pp, me = mesh.size("pp"), mesh.rank("pp")
        per_stage = -(-args.layers // self.n_pp)
        self.stage = Stage(args, me * per_stage, min(args.layers, (me + 1) * per_stage), args.layers, self.tp)
        self.opt = torch.optim.AdamW(self.stage.parameters(), lr=args.lr)
        self.sched = hvd.parallel.Schedule1F1B(
            hvd.parallel.PipelineStage(self.stage, me, self.n_pp, process_set=pp),
            args.microbatches,
            loss_fn=self.loss_fn,
        )
        self.corpus = load_corpus(args.corpus_bytes)
        self.last_stage = me == self.n_pp - 1

    def loss_fn(self, logits, target):
        return hvd.parallel.vocab_parallel_cross_entropy(
            logits.flatten(0, 1), target.flatten(), process_set=self.tp
        )

    def step(self, step, replicas, n_replicas, kill=False):
        """One step; returns the loss (the mean over all n_replicas replicas)."""
        self.opt.zero_grad()
        mine = torch.zeros(())
        for replica in replicas:
            x, y = batch(self.corpus, self.args, step, replica)
            losses: list = []
            self.sched.step(x, target=y, losses=losses)
            if self.last_stage:
                mine = mine + torch.stack(losses).mean()
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: peers wait on our gradients
        grads = [p.grad for p in self.stage.parameters()]
        hvd.grouped_allreduce_(grads, op=hvd.Sum, name="dp.grads", process_set=self.dp)
        for g in grads:
            g.div_(n_replicas)
        self.opt.step()
        # every rank of the last stage holds the loss of its replicas (tp ranks: the same one)
        total = hvd.allreduce(mine.detach(), op=hvd.Sum, name="loss").item()
        return total / (n_replicas * self.mesh.size("tp"))


def report(args, step, loss, bar):
    bar.set_postfix(loss="%.3f" % loss, refresh=False)  # a refresh here shows a stale count
    if args.print_losses and hvd.rank() == 0:
        print("step %d loss %.7f ranks %d" % (step, loss, hvd.size()), flush=True)


def train_plain(args, trainer):
    bar = tqdm(range(args.steps), disable=hvd.rank() != 0, mininterval=0.5)
    losses = []
    for step in bar:
        losses.append(trainer.step(step, [trainer.mesh.rank("dp")], trainer.mesh.size("dp")))
        report(args, step, losses[-1], bar)
    return losses


def train_elastic(args, trainer):
    """hvd.elastic.run over MeshState: a commit after every step; returns (losses, the longest
    and the median gap between this process's commits, in s)."""
    buddies = False if args.no_buddies else None  # None: buddy copies where dp is 1
    state = hvd.parallel.MeshState(
        trainer.mesh, model=trainer.stage, optimizer=trainer.opt, buddies=buddies, step=0, losses=[]
    )
    commits, first = [time.monotonic()], [] if hvd.parallel.MeshState.joined_late() else [True]
    state.register_reset_callbacks([lambda: first.clear()])  # --kill-*: the first generation only

    @hvd.elastic.run
    def train(state):
        bar = tqdm(range(state.step, args.steps), disable=hvd.rank() != 0, mininterval=0.5)
        for step in bar:
            kill = bool(first) and hvd.rank() == args.kill_rank and step == args.kill_step
            state.losses.append(trainer.step(step, state.replicas(), state.dp_replicas, kill))
            report(args, step, state.losses[-1], bar)
            state.step = step + 1
            state.commit()
            commits.append(time.monotonic())

    train(state)
    gaps = sorted(b - a for a, b in itertools.pairwise(commits))
    return state.losses, gaps[-1] if gaps else 0.0, gaps[len(gaps) // 2] if gaps else 0.0


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    if args.elastic and hvd.parallel.MeshState.joined_late():
        # a worker the driver started later takes over a coordinate no survivor holds (restored
        # from its buddy copy by the MeshState's first sync), or is released (exit 0) inside
        mesh = hvd.parallel.MeshState.join()
    else:
        mesh = hvd.Mesh(pp=args.pp, dp=args.dp, tp=args.tp)
    if hvd.rank() == 0:
        print(mesh.describe(), flush=True)
    trainer = Trainer(args, mesh)
    if args.elastic:
        losses, longest, median = train_elastic(args, trainer)
    else:
        losses = train_plain(args, trainer)
    if hvd.rank() == 0:
        print(
            "loss %.3f -> %.3f after %d steps on %s" % (losses[0], losses[-1], args.steps, mesh), flush=True
        )
        if args.elastic:
            print("commits: longest gap %.3f s, median %.3f s" % (longest, median), flush=True)
        if args.print_losses:
            print("committed losses %s" % " ".join("%.7f" % v for v in losses), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
