"""Offline conversion between hvdlite's ZeRO checkpoints (checkpoint.py) and
torch.distributed.checkpoint (DCP) directories, in both directions, so that a ZeRO job's state
loads into an FSDP2 model (or any model DCP loads) and back. docs/zero.md, "To and from
torch.distributed.checkpoint".

The DCP side holds {model_key: model state_dict, optim_key: optimizer state_dict} in the form
torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer) gives and
set_state_dict takes: parameters and buffers by fully qualified name, the optimizer's state
keyed by parameter name ({"state": {name: {"step": ..., "exp_avg": ...}}, "param_groups":
[{hyperparameters..., "params": [names]}]}). Tensors are written whole; DCP reshards them on
load (into DTensor shards of an FSDP2 model, say).

zero_to_dcp reads the ZeRO directory as load_checkpoint does (memory-mapped shard files, each
parameter's elements gathered from the shards that hold them) and writes it with dcp.save in
this process (no process group, no job). dcp_to_zero reads a DCP directory whole
(torch.distributed.checkpoint.format_utils.dcp_to_torch_save) and writes a ZeRO directory of
one shard and one bucket per parameter (plain_checkpoint.py's layout), which load_checkpoint
reshards to any world size, stage and shard_size. Both run in one process and hold the whole
model and optimizer state in memory once. Element-wise optimizer state (Adam's moments) maps
element for element; scalar state (Adam's step) is per bucket in ZeRO and per parameter in
torch: zero_to_dcp copies a bucket's to each of its parameters, dcp_to_zero keeps each
parameter's (one bucket per parameter).
"""

import os
import tempfile

import torch

from hvdlite.common import exceptions
from hvdlite.torch.parallel.zero import checkpoint_io
from hvdlite.torch.parallel.zero.checkpoint import _Reader

MODEL_KEY, OPTIM_KEY = "model", "optim"


def zero_to_dcp(src, dst, model_key=MODEL_KEY, optim_key=OPTIM_KEY):
    """Writes the ZeRO checkpoint directory `src` (hvd.save_checkpoint) as a
    torch.distributed.checkpoint directory `dst`: {model_key: state_dict, optim_key: the
    optimizer's state_dict by parameter name}. One process, no job. Returns the state it wrote."""
    from torch.distributed.checkpoint.state_dict_saver import save

    reader = _Reader(src)
    rest = reader.rest()
    model = {
        key: reader.full(name).clone() if name is not None else rest[key]
        for key, name in reader.meta["state_keys"]
    }
    groups = [dict(g, params=[]) for g in reader.meta["param_groups"]]
    state = {}
    for bucket in reader.meta["buckets"]:
        for slot in bucket["slots"]:
            name = slot["name"]
            scalars, keys = reader.scalar_state(name)
            entry = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars.items()}
            entry.update({k: reader.full(name, k).clone() for k in keys})
            if entry:
                state[name] = entry
            if groups:
                groups[bucket["group"]]["params"].append(name)
    out = {model_key: model, optim_key: {"state": state, "param_groups": groups}}
    save(out, checkpoint_id=dst, no_dist=True)
    return out


def dcp_to_zero(src, dst, model_key=MODEL_KEY, optim_key=OPTIM_KEY):
    """Writes the torch.distributed.checkpoint directory `src` ({model_key: state_dict,
    optim_key: optimizer state_dict by parameter name}, as zero_to_dcp writes it or an FSDP2
    job saves get_state_dict's) as a ZeRO checkpoint directory `dst` that hvd.load_checkpoint
    loads at any world size and stage. One process, no job."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        whole = os.path.join(tmp, "whole.pt")
        dcp_to_torch_save(src, whole)
        loaded = torch.load(whole, weights_only=False)
    if model_key not in loaded:
        raise exceptions.InvalidArgumentError(
            "%s holds no %r entry (it holds %s); pass model_key=" % (src, model_key, sorted(loaded))
        )
    model = {k: _plain(v) for k, v in loaded[model_key].items()}
    optim = loaded.get(optim_key) or {"state": {}, "param_groups": []}
    payload, buckets, managed = _zero_payload(src, model, optim)
    keys = [(key, key if key in managed else None) for key in model]
    rest = {key: value for key, value in model.items() if key not in managed}
    meta = {
        "format": checkpoint_io.FORMAT,
        "stage": 0,
        "layout": {"size": 1, "shard_count": 1, "replicas": 1},
        "buckets": buckets,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in optim["param_groups"]],
        "optimizer": None,
        "state_keys": keys,
    }
    shard = checkpoint_io.shard_file("", 0, 1)
    files = {shard: payload, "rest.pt": rest}
    data = checkpoint_io.local_data_name()
    checkpoint_io.start(dst, data, files, meta, {shard: 0, "rest.pt": 0}, blocking=True)


def _plain(value):
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _zero_payload(src, model, optim):
    """(shard payload, meta buckets, managed names): one bucket per parameter the optimizer
    holds (all floating-point model entries when it holds none), in its groups' order."""
    groups = optim["param_groups"] or [{"params": [k for k, v in model.items() if v.is_floating_point()]}]
    master, state, buckets, managed = [], [], [], set()
    for gi, group in enumerate(groups):
        for name in group["params"]:
            if name not in model:
                raise exceptions.InvalidArgumentError(
                    "%s: the optimizer's group %d names parameter %r, which the model state lacks"
                    % (src, gi, name)
                )
            p = model[name].detach().to(torch.float32)
            managed.add(name)
            slot = {"name": name, "offset": 0, "numel": p.numel(), "shape": list(p.shape)}
            buckets.append({"group": gi, "numel": p.numel(), "shard_numel": p.numel(), "slots": [slot]})
            master.append(p.reshape(-1).clone())
            entries = optim["state"].get(name, {})
            state.append({k: _flat_if_elementwise(_plain(v), p) for k, v in entries.items()})
    return {"master": master, "state": state}, buckets, managed


def _flat_if_elementwise(value, param):
    if torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape:
        return value.detach().to(torch.float32).reshape(-1).clone()
    return value
