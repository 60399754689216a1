"""Rank bodies of tests/test_torch_backend_models.py: torch's own parallel training code on the
"hvdlite" backend, each compared with one process training the same model on the whole batch
(computed in the same rank, with no communication)."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch_backend_cases import start

STEPS = 3


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _batches(n, per_rank=4):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(per_rank * n, 16, generator=g), torch.randn(per_rank * n, 4, generator=g))
        for _ in range(STEPS)
    ]


def _reference(batches, opt_cls=torch.optim.SGD, **opt_kw):
    ref = _model()
    opt = opt_cls(ref.parameters(), **opt_kw)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    return ref.state_dict()


def _max_err(state, ref_state):
    return max((state[k] - v).abs().max().item() for k, v in ref_state.items())


def ddp(variant):
    """DDP with small buckets (several per step, overlapped with backward), or no_sync
    accumulation, gradient_as_bucket_view, or a comm hook; returns the max error against the
    single process and whether the replicas are identical."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = start()
    try:
        kw = {"bucket_cap_mb": 0.002}
        if variant == "bucket_view":
            kw["gradient_as_bucket_view"] = True
        model = DDP(_model(), **kw)
        if variant == "hook":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        batches = _batches(n, per_rank=4)
        for x, y in batches:
            opt.zero_grad()
            mine_x, mine_y = x[r * 4 : (r + 1) * 4], y[r * 4 : (r + 1) * 4]
            if variant == "no_sync":  # two micro-batches, the first without communication
                with model.no_sync():
                    (nn.functional.mse_loss(model(mine_x[:2]), mine_y[:2]) / 2).backward()
                (nn.functional.mse_loss(model(mine_x[2:]), mine_y[2:]) / 2).backward()
            else:
                nn.functional.mse_loss(model(mine_x), mine_y).backward()
            opt.step()
        state = model.module.state_dict()
        ref = _reference(batches, lr=0.05, momentum=0.9)
        flat = torch.cat([v.reshape(-1) for v in state.values()])
        gathered = [torch.zeros_like(flat) for _ in range(n)]
        dist.all_gather(gathered, flat)
        return _max_err(state, ref), all(torch.equal(gathered[0], g) for g in gathered)
    finally:
        dist.destroy_process_group()


def fsdp2(reshard_after_forward):
    """fully_shard per layer and on the root, AdamW: the full state equals one process's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    r, n = start()
    try:
        mesh = init_device_mesh("cpu", (n,))
        model = _model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        batches = _batches(n)
        for x, y in batches:
            opt.zero_grad()
            nn.functional.mse_loss(model(x[r * 4 : (r + 1) * 4]), y[r * 4 : (r + 1) * 4]).backward()
            opt.step()
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        return _max_err(full, _reference(batches, torch.optim.AdamW, lr=0.01))
    finally:
        dist.destroy_process_group()


def tensor_parallel():
    """DTensor's parallelize_module (colwise then rowwise): forward and gradients equal one process's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    start()
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        tp, ref = _model(), _model()
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
        out, ref_out = tp(x), ref(x)
        out.sum().backward()
        ref_out.sum().backward()
        grad_err = (tp[0].weight.grad.full_tensor() - ref[0].weight.grad).abs().max().item()
        return (out - ref_out).abs().max().item(), grad_err
    finally:
        dist.destroy_process_group()


def pipelining(schedule_name):
    """torch.distributed.pipelining: the model split into one stage per rank, 4 micro-batches; the
    loss and the gradients equal one process's."""
    from torch.distributed import pipelining as pp

    r, n = start()
    try:
        full = _model()
        bounds = {2: [(0, 2), (2, 5)], 3: [(0, 2), (2, 4), (4, 5)]}[n]
        lo, hi = bounds[r]
        stage_module = nn.Sequential(*[full[i] for i in range(lo, hi)])
        stage = pp.PipelineStage(stage_module, r, n, torch.device("cpu"))
        schedule = getattr(pp, schedule_name)(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
        x, y = _batches(1, per_rank=8)[0]
        losses = []
        if r == 0:
            schedule.step(x)
        elif r == n - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        ref = _model()
        ref_loss = sum(nn.functional.mse_loss(ref(xc), yc) for xc, yc in zip(x.chunk(4), y.chunk(4)))
        (ref_loss / 4).backward()  # the schedule scales gradients by 1 / n_microbatches (scale_grads)
        grad_err = max(
            (p.grad - ref[lo + int(name.split(".")[0])].get_parameter(name.split(".", 1)[1]).grad)
            .abs()
            .max()
            .item()
            for name, p in stage_module.named_parameters()
        )
        loss_err = abs(sum(loss.item() for loss in losses) - ref_loss.item()) if losses else 0.0
        return grad_err, loss_err
    finally:
        dist.destroy_process_group()


def distributed_checkpoint(path):
    """torch.distributed.checkpoint: an FSDP2 model's sharded state saved and loaded into a fresh one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    start()
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        a = _model(seed=5)
        fully_shard(a, mesh=mesh)
        dcp.save({"model": a.state_dict()}, checkpoint_id=path)
        b = _model(seed=6)
        fully_shard(b, mesh=mesh)
        state = {"model": b.state_dict()}
        dcp.load(state, checkpoint_id=path)
        b.load_state_dict(state["model"])
        fa = {k: v.full_tensor() for k, v in a.state_dict().items()}
        fb = {k: v.full_tensor() for k, v in b.state_dict().items()}
        return all(torch.equal(fa[k], fb[k]) for k in fa)
    finally:
        dist.destroy_process_group()
