"""Elastic ZeRO training (stages 1, 2 and 3 side by side with plain data parallelism, one
TorchState) run by tests/test_elastic_zero.py under `hvdliterun --min-np ...`. Every step trains
four copies of one small MLP, three each with its own ZeroOptimizer(AdamW, stage=1|2|3) and one
with hvd.DistributedOptimizer(AdamW) (every rank holds the whole state), on the same global batch of
GLOBAL rows (rank r of n takes rows [r*GLOBAL/n, (r+1)*GLOBAL/n)), and commits.

ELASTIC_KILL="worker_id:step": that worker SIGKILLs itself in that step, after backward (its
gradients' reduce-scatters submitted). ELASTIC_KILL_IN_EXCHANGE="worker_id:step": that worker
SIGKILLs itself inside the commit ending that step, after the stage-1 optimizer's buddy exchange
was started and before the stage-2 one's (TorchState's default buddy_overlap leaves exchanges
running): the survivors wait for a copy that never comes and must fall back a commit. ELASTIC_CKPT: a directory rank 0.. saves a ZeRO checkpoint
of the stage-3 model into after the last step. Rank 0 prints "DONE <json>": the committed
(step, size, time) log, every ZeRO model's full_state_dict, the plain model's state_dict
("plain"), per rank and stage the optimizer state elements it holds against the model's
parameter count, and per ZeroOptimizer whether its buddy copies are mapped /dev/shm files
("shared"; hvdlite/torch/elastic/buddy_shm.py) rather than sent.
"""

import json
import os
import signal
import time

import torch

import hvdlite.torch as hvd

STEPS, GLOBAL, STAGES = int(os.environ.get("ELASTIC_STEPS", "12")), 8, (1, 2, 3)
ME = os.environ.get("HVDLITE_ELASTIC_WORKER_ID", "")


def _kills(var):
    return dict(item.rsplit(":", 1) for item in filter(None, os.environ.get(var, "").split(",")))


KILL, KILL_IN_EXCHANGE = _kills("ELASTIC_KILL"), _kills("ELASTIC_KILL_IN_EXCHANGE")


def kill_in_exchange(state):
    """Makes state.commit() SIGKILL this worker just before the stage-2 ZeroOptimizer's save."""
    handler = state._handlers["opt2"]
    save = handler.save

    def killing_save():
        if KILL_IN_EXCHANGE.get(ME) == str(state.step - 1):
            os.kill(os.getpid(), signal.SIGKILL)
        save()

    handler.save = killing_save


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def optimizer(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL, 8, generator=g), torch.randn(GLOBAL, 3, generator=g)


def state_elements(z):
    return sum(
        v.numel() for st in z.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() == 1
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    nets = [model() for _ in STAGES]
    opts = [hvd.ZeroOptimizer(optimizer(n.parameters()), n, stage=s) for n, s in zip(nets, STAGES)]
    named = {}
    for s, n, o in zip(STAGES, nets, opts):
        named["model%d" % s], named["opt%d" % s] = n, o
    plain = model()
    plain_opt = hvd.DistributedOptimizer(
        optimizer(plain.parameters()), named_parameters=plain.named_parameters()
    )
    state = hvd.elastic.TorchState(step=0, log=[], model0=plain, opt0=plain_opt, **named)
    kill_in_exchange(state)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            x, y = batch(state.step)
            n, r = hvd.size(), hvd.rank()
            rows = slice(r * GLOBAL // n, (r + 1) * GLOBAL // n)
            for net, opt in zip([*nets, plain], [*opts, plain_opt]):
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x[rows]), y[rows]).backward()
            if KILL.get(ME) == str(state.step):
                os.kill(os.getpid(), signal.SIGKILL)
            for opt in [*opts, plain_opt]:
                opt.step()
            state.log.append((state.step, n, time.time()))
            state.step += 1
            state.commit()

    train(state)
    full = [{k: v.tolist() for k, v in hvd.full_state_dict(net).items()} for net in nets]
    plain_full = {k: v.tolist() for k, v in plain.state_dict().items()}
    sizes = hvd.allgather_object([state_elements(z) for z in opts])
    if os.environ.get("ELASTIC_CKPT"):
        hvd.save_checkpoint(os.environ["ELASTIC_CKPT"], nets[-1], opts[-1])
    if hvd.rank() == 0:
        params = sum(p.numel() for p in nets[0].parameters())
        print(
            "DONE "
            + json.dumps(
                {
                    "log": state.log,
                    "full": full,
                    "plain": plain_full,
                    "sizes": sizes,
                    "params": params,
                    "shared": [h.copies._shared is not None for h in state._zero_handlers()],
                }
            ),
            flush=True,
        )
    hvd.shutdown()
