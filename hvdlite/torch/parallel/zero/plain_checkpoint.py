"""save_checkpoint for a model without ZeRO: every rank holds it whole (data parallelism, or
one process without a job), so one process writes it, in the ZeRO format (checkpoint.py) with a
single shard and one bucket per parameter. load_checkpoint reads it like any ZeRO checkpoint: into
a plain optimizer, or resharded into a ZeroOptimizer of any world size, stage and shard_size.

Who writes: global rank 0 of a running job, or this process when no job runs; the other ranks
write nothing (only blocking=True's final barrier involves them). No collective otherwise.
"""

import torch

from hvdlite.common import basics, exceptions
from hvdlite.common.topology import rank as global_rank
from hvdlite.common.topology import size as global_size
from hvdlite.torch import mpi_ops
from hvdlite.torch.parallel.zero import checkpoint_io


def _groups(model, opt):
    """[(group index, [params])]: the optimizer's groups, or all parameters as one group."""
    if opt is None:
        return [(0, list(model.parameters()))]
    return [(gi, list(g["params"])) for gi, g in enumerate(opt.param_groups)]


def _elementwise(value, param):
    return torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape


def _contents(model, opt):
    """(shard payload, meta buckets, {id(param): name}) of `model` and `opt`, live tensors."""
    names = {id(p): n for n, p in model.named_parameters()}
    buckets, master, state, managed = [], [], [], {}
    for gi, params in _groups(model, opt):
        for p in params:
            name = names.get(id(p))
            if name is None:
                raise exceptions.InvalidArgumentError(
                    "save_checkpoint: a parameter of the optimizer's group %d (shape %s) is not a"
                    " parameter of the model; pass the optimizer built for this model" % (gi, tuple(p.shape))
                )
            managed[id(p)] = name
            slot = {"name": name, "offset": 0, "numel": p.numel(), "shape": list(p.shape)}
            buckets.append({"group": gi, "numel": p.numel(), "shard_numel": p.numel(), "slots": [slot]})
            master.append(p.detach().reshape(-1))
            entries = opt.state.get(p, {}) if opt is not None else {}
            state.append({k: v.detach().reshape(-1) if _elementwise(v, p) else v for k, v in entries.items()})
    return {"master": master, "state": state}, buckets, managed


def save(path, model, opt, blocking):
    """The plain-model branch of checkpoint.save_checkpoint (same contract). The caller has
    joined this process's previous save."""
    job = basics.is_initialized()
    if not job or global_rank() == 0:
        payload, buckets, managed = _contents(model, opt)
        rest, keys = checkpoint_io.rest_and_keys(model, managed)
        keep = checkpoint_io.compact if blocking else checkpoint_io.host_copy
        size = global_size() if job else 1
        meta = {
            "format": checkpoint_io.FORMAT,
            "stage": 0,
            "layout": {"size": size, "shard_count": 1, "replicas": size},
            "buckets": buckets,
            "param_groups": []
            if opt is None
            else [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
            "optimizer": None if opt is None else type(opt).__name__,
            "state_keys": keys,
        }
        shard = checkpoint_io.shard_file("", 0, 1)
        files = {shard: keep(payload), "rest.pt": keep(rest)}
        data = checkpoint_io.local_data_name()
        checkpoint_io.start(path, data, files, meta, {shard: 0, "rest.pt": 0}, blocking)
    if blocking and job:
        mpi_ops.barrier()
