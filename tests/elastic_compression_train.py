"""An elastic PyTorch loop whose DistributedOptimizer compresses with a stateful compressor
(Compression.topk, error feedback), run by tests/test_elastic.py under `hvdliterun --min-np`.

ELASTIC_KILL="worker_id:step": that worker SIGKILLs itself in that step, after backward()
submitted its gradients (so every rank's compressor already replaced its residual for a
step that will not commit). Each rank records, whenever train() is entered, a digest of its
residuals and the digest it had at its last commit: after a reset the two must agree. Each
worker prints "RESIDUALS <json>"; rank 0 also prints "DONE <json log> <json losses>", the log
holding per committed step (step, ranks, whether every replica's parameters were identical).
"""

import hashlib
import json
import os
import signal

import torch

import hvdlite.torch as hvd

N, EPOCHS, BATCH = 48, 2, 4
ME = os.environ.get("HVDLITE_ELASTIC_WORKER_ID", "")
KILL = dict(item.rsplit(":", 1) for item in filter(None, os.environ.get("ELASTIC_KILL", "").split(",")))


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, 16, generator=g)
    return x, torch.tanh(x @ torch.randn(16, 1, generator=g))


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(b"none" if t is None else t.detach().numpy().tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    x, y = data()
    net = model()
    compression = hvd.Compression.topk(ratio=0.1, min_numel=256)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        named_parameters=net.named_parameters(),
        compression=compression,
    )
    sampler = hvd.elastic.ElasticSampler(list(range(N)), shuffle=True, seed=1)
    state = hvd.elastic.TorchState(net, opt, sampler=sampler, epoch=0, step=0, log=[])
    committed = {}
    entries = []

    def residuals():
        return digest([compression.residual(n) for n, _ in net.named_parameters()])

    @hvd.elastic.run
    def train(state):
        entries.append((state.step, residuals(), committed.get("digest")))
        while state.epoch < EPOCHS:
            indices = list(state.sampler)
            for start in range(0, len(indices), BATCH):
                batch = indices[start : start + BATCH]
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x[batch]), y[batch]).backward()
                if KILL.get(ME) == str(state.step):
                    os.kill(os.getpid(), signal.SIGKILL)
                opt.step()
                same = len(set(hvd.allgather_object(digest(net.parameters())))) == 1
                state.log.append((state.step, hvd.size(), same))
                state.step += 1
                state.sampler.record_batch(start // BATCH, len(batch))
                committed["digest"] = residuals()
                state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            committed["digest"] = residuals()
            state.commit()

    with torch.no_grad():
        first = float(torch.nn.functional.mse_loss(net(x), y))
    train(state)
    print("RESIDUALS %s" % json.dumps(entries), flush=True)
    if hvd.rank() == 0:
        with torch.no_grad():
            last = float(torch.nn.functional.mse_loss(net(x), y))
        print("DONE %s [%r, %r]" % (json.dumps(state.log), first, last), flush=True)
    hvd.shutdown()
