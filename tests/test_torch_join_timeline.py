"""hvd.join() with uneven batches (a DistributedOptimizer training run where
ranks have different numbers of batches finishes without deadlock), and
start_timeline / stop_timeline from hvdlite.torch."""

import json

import torch
from helpers import run_pooled
from torch_wire import from_wire, to_wire


def _uneven_training():
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    batches = 2 + 2 * r  # rank 0 runs out first
    g = torch.Generator().manual_seed(r)
    for _ in range(batches):
        opt.zero_grad()
        model(torch.randn(3, 4, generator=g)).pow(2).mean().backward()
        opt.step()
    gathered = None
    if r == hvd.size() - 1:  # the others have joined: Horovod allows only allreduce now
        try:
            hvd.allgather(torch.tensor([[r]]))
        except hvd.NotSupportedError as e:
            gathered = (isinstance(e, RuntimeError), "joined" in str(e))
    last = hvd.join()
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)  # Horovod's pattern after join
    out = {"last": last, "batches": batches, "params": dict(model.state_dict()), "gathered": gathered}
    hvd.shutdown()
    return to_wire(out)


def test_join_with_uneven_batches():
    results = from_wire(run_pooled(_uneven_training, 3, timeout=90))
    for res in results:
        assert res["last"] == 2
        for key, value in results[2]["params"].items():
            assert torch.equal(res["params"][key], value), key
    assert results[2]["gathered"] == (True, True)  # allgather with joined ranks fails, as in Horovod


def _timeline(path):
    import hvdlite.torch as hvd

    hvd.init()
    hvd.start_timeline(path)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    hvd.stop_timeline()
    hvd.shutdown()


def test_timeline_start_stop_records_optimizer_allreduces(tmp_path):
    path = str(tmp_path / "torch_timeline.json")
    run_pooled(_timeline, 2, args=(path,), timeout=60)
    with open(path) as f:
        events = json.load(f)
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"allreduce.weight", "allreduce.bias"} <= names  # Horovod's PyTorch names: "<kind>.<name>"
    assert any(e.get("ph") == "X" and e["name"] == "ALLREDUCE" for e in events)
