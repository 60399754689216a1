"""An elastic PyTorch training loop (TorchState, ElasticSampler, DistributedOptimizer) run by
tests/test_elastic_torch.py under `hvdliterun --min-np ...`. Commits after every batch and logs, per
committed step, every rank's batch indices (allgather_object), so the test can replay the
committed steps with plain SGD and check the final parameters.

ELASTIC_KILL="worker_id:step": that worker SIGKILLs itself in that step, after backward()
submitted its gradients' allreduce; with ELASTIC_KILL_SIGNAL=SIGSTOP it stops itself instead (a
frozen worker). Prints "DONE <json log> <json params>" on rank 0.
"""

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
    x = torch.randn(N, 3, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 0.1
    return x, y


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1).double()


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    x, y = data()
    net = model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05), named_parameters=net.named_parameters()
    )
    sampler = hvd.elastic.ElasticSampler(list(range(N)), shuffle=True, seed=1)
    state = hvd.elastic.TorchState(net, opt, sampler=sampler, epoch=0, step=0, log=[])

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            indices = list(state.sampler)
            for start in range(0, len(indices), BATCH):
                batch = indices[start : start + BATCH]
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(net(x[batch]), y[batch])
                loss.backward()
                if KILL.get(ME) == str(state.step):
                    os.kill(os.getpid(), signal.Signals[os.environ.get("ELASTIC_KILL_SIGNAL", "SIGKILL")])
                opt.step()
                state.log.append((state.step, hvd.allgather_object(batch)))
                state.step += 1
                state.sampler.record_batch(start // BATCH, len(batch))
                state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        params = [p.detach().tolist() for p in net.parameters()]
        print("DONE %s %s" % (json.dumps(state.log), json.dumps(params)), flush=True)
    hvd.shutdown()
