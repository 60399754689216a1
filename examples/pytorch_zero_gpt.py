"""A small GPT trained with ZeRO stage 3 on the Python standard library's own source text.

    hvdliterun -np 2 python examples/pytorch_zero_gpt.py --steps 200
    hvdliterun -np 4 python examples/pytorch_zero_gpt.py --stage 3 --shard-size 2   # hybrid

Byte-level tokens (vocabulary 256) from every .py file under the stdlib directory (present on
every machine with Python), a decoder-only transformer, AdamW wrapped in hvd.ZeroOptimizer:
outside forward/backward each rank holds only its shard of the parameters, gradients and
optimizer state. Each rank trains on its own random windows of the corpus; rank 0 prints the
loss, and at the end saves a sharded checkpoint, consolidates it into a plain state_dict and
prints a sample. `GPT` is also the model of benchmarks/zero_gpt.py.
"""

import argparse
import glob
import os
import sysconfig
import tempfile

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block. Every parameter is used inside the forward of the module
    that registers it (what ZeRO stage 3's per-module gathering needs)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=256, d=128, layers=2, heads=4, context=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: the head module uses the embedding's weight
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def stdlib_corpus(limit_bytes):
    """Bytes of the standard library's .py files (sorted, so every rank reads the same)."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()


def sample(model, prompt, n):
    idx = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -model.wpe.num_embeddings :])[:, -1]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    return bytes(idx[0].tolist()).decode(errors="replace")


def main():
    import hvdlite.torch as hvd

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--stage", type=int, default=3, choices=(1, 2, 3))
    p.add_argument("--shard-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--checkpoint", default=None, help="directory for the sharded checkpoint")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT()
    context = model.wpe.num_embeddings
    data = stdlib_corpus(4 << 20)
    opt = hvd.ZeroOptimizer(
        torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01),
        model,
        stage=args.stage,
        shard_size=args.shard_size,
    )
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(data) - context - 1, (args.batch,), generator=gen)
        x = torch.stack([data[s : s + context] for s in starts])
        y = torch.stack([data[s + 1 : s + context + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
        if hvd.rank() == 0 and (step % 20 == 0 or step == 1):
            print("step %4d  loss %.3f" % (step, loss.item()), flush=True)
    path = args.checkpoint or os.path.join(tempfile.gettempdir(), "hvdlite_zero_gpt")
    hvd.save_checkpoint(path, model, opt)
    text = sample(model, "def ", 40)  # every rank: stage 3's gathers are collective
    if hvd.rank() == 0:
        state = hvd.consolidate_checkpoint(path, os.path.join(path, "model.pt"))
        print("checkpoint %s: %d tensors, consolidated into model.pt" % (path, len(state)))
        print("sample: %r" % text)
    hvd.shutdown()


if __name__ == "__main__":
    main()
