"""Sharded ZeRO checkpoints that load at any world size, stage or shard_size.

A checkpoint is a directory:
  meta.json              the commit point (written last, atomically: checkpoint_io.py);
                         layout: every parameter's name, shape, bucket and flat offset, the
                         shard count and shard_numel of every bucket, the optimizer's param
                         group hyperparameters, state_dict keys (tied names included), and
                         "data": the folder holding the files below
  data-<id>/shard-<i>-of-<S>.pt
                         member i's master shards and optimizer-state shards, per bucket
                         (written by the first shard group only: the others hold the same bits)
  data-<id>/rest.pt      model.state_dict() entries ZeRO does not manage (buffers, frozen
                         parameters outside the optimizer), from the first rank of the set
A meta.json without "data" (the format before asynchronous saves) has the files beside it.

Loading maps each element of this rank's new shards back to (old bucket, old flat offset),
so it reads only the old shard files that hold them (memory-mapped). consolidate_checkpoint
turns a directory into one plain, torch.load-able state_dict without any running job.
"""

import json
import os

import torch

from hvdlite.common import exceptions
from hvdlite.common.topology import rank as global_rank
from hvdlite.torch import mpi_ops
from hvdlite.torch.parallel.zero import checkpoint_io, plain_checkpoint
from hvdlite.torch.parallel.zero.checkpoint_io import FORMAT, shard_file
from hvdlite.torch.parallel.zero.optimizer import OWNERS, ZeroOptimizer
from hvdlite.torch.parallel.zero.shard import describe


def _managed_ids(z):
    return {id(s.param): s.name for b in z.buckets for s in b.slots}


def save_checkpoint(path, model, opt=None, blocking=True):
    """Writes `model` and its optimizer under directory `path`, replacing the checkpoint there
    atomically (checkpoint_io.py: a crash mid-write leaves the previous one). Joins this
    process's pending save first. With a ZeroOptimizer (`opt`, or the one built on `model`):
    every member writes its shards; collective over its process set. Otherwise `opt` is a plain
    torch optimizer (or None) of a model every rank holds whole: rank 0 writes it all
    (plain_checkpoint.py). blocking=True: returns once the checkpoint is complete (a barrier
    when a job runs). blocking=False: returns once this rank's part is copied to host memory
    (training may change the model at once) and writes it in a background thread;
    wait_checkpoint() or the next save joins it."""
    checkpoint_io.wait()
    z = opt if isinstance(opt, ZeroOptimizer) else OWNERS.get(model)
    if z is None:
        plain_checkpoint.save(path, model, opt, blocking)
        return
    z._finish_pending_for_checkpoint()
    g, ps = z.groups, z.process_set
    data = checkpoint_io.new_data_name(ps)
    keep = checkpoint_io.compact if blocking else checkpoint_io.host_copy
    files, meta, expect = {}, None, {}
    if g.group_index == 0:
        payload = {
            "master": [m.detach() for m in z.master],
            "state": [dict(z._inner.state.get(m, {})) for m in z.master],
        }
        files[shard_file("", g.member, g.shard_count)] = keep(payload)
    if global_rank() == ps.ranks[0]:
        rest, keys = checkpoint_io.rest_and_keys(model, _managed_ids(z))
        files["rest.pt"] = keep(rest)
        meta = _meta(z, keys)
        expect = {shard_file("", i, g.shard_count): ps.ranks[i] for i in range(g.shard_count)}
        expect["rest.pt"] = ps.ranks[0]
    checkpoint_io.start(path, data, files, meta, expect, blocking)
    if blocking:
        mpi_ops.barrier(ps)


def wait_checkpoint():
    """Joins this process's pending save_checkpoint(blocking=False) and raises its error
    (hvdlite.HvdliteError naming the path and rank); returns at once when none is pending. Not
    collective: on the set's first rank it returns once the checkpoint is committed."""
    checkpoint_io.wait()


def _meta(z, keys):
    g = z.groups
    return {
        "format": FORMAT,
        "stage": z.stage,
        "layout": g.layout(),
        "buckets": describe(z.buckets),
        "param_groups": [{k: v for k, v in grp.items() if k != "params"} for grp in z._inner.param_groups],
        "optimizer": type(z._inner).__name__,
        "state_keys": keys,
    }


class _Reader:
    """Reads element ranges of parameters (master values or one state key) from a checkpoint."""

    def __init__(self, path):
        self.path = path
        with open(os.path.join(path, checkpoint_io.META)) as f:
            self.meta = json.load(f)
        if self.meta.get("format") != FORMAT:
            raise exceptions.InvalidArgumentError("%s is not an hvdlite ZeRO checkpoint" % path)
        self.folder = os.path.join(path, self.meta.get("data", ""))  # "": the format before data-<id>/
        self.count = self.meta["layout"]["shard_count"]
        self.loc = {}
        for bi, b in enumerate(self.meta["buckets"]):
            for s in b["slots"]:
                self.loc[s["name"]] = (bi, s["offset"], s["numel"], tuple(s["shape"]))
        self._files = {}

    def _file(self, j):
        if j not in self._files:
            self._files[j] = torch.load(shard_file(self.folder, j, self.count), mmap=True, weights_only=True)
        return self._files[j]

    def read(self, name, a, c, key=None):
        """Elements [a, c) of parameter `name`'s flat master (key None) or state `key`."""
        if name not in self.loc:
            raise exceptions.InvalidArgumentError("checkpoint %s has no parameter %r" % (self.path, name))
        bi, offset, _, _ = self.loc[name]
        sh = self.meta["buckets"][bi]["shard_numel"]
        out = torch.empty(c - a, dtype=torch.float32)
        pos = offset + a
        while pos < offset + c:
            j, lo = divmod(pos, sh)
            n = min(sh - lo, offset + c - pos)
            f = self._file(j)
            src = f["master"][bi] if key is None else f["state"][bi][key]
            out[pos - offset - a : pos - offset - a + n].copy_(src[lo : lo + n])
            pos += n
        return out

    def scalar_state(self, name):
        """The non-elementwise (scalar) state entries of the bucket holding `name`, and the keys
        of its elementwise ones."""
        bi = self.loc[name][0]
        state = self._file(0)["state"][bi]
        sh = self.meta["buckets"][bi]["shard_numel"]
        scalars = {
            k: v for k, v in state.items() if not (torch.is_tensor(v) and v.numel() == sh and v.dim() == 1)
        }
        return scalars, [k for k in state if k not in scalars]

    def full(self, name, key=None):
        _, _, numel, shape = self.loc[name]
        return self.read(name, 0, numel, key).view(shape)

    def rest(self):
        return torch.load(os.path.join(self.folder, "rest.pt"), weights_only=True)


def _restore_hyperparameters(group, saved):
    """Saved values of the plain (JSON-exact) hyperparameters this group also has."""
    for k, v in saved.items():
        if k == "params" or k not in group or isinstance(group[k], torch.Tensor):
            continue
        if isinstance(v, (bool, int, float, type(None))):
            group[k] = v
        elif isinstance(v, list) and isinstance(group[k], (tuple, list)):
            group[k] = type(group[k])(v)


def _load_bucket(reader, z, bucket):
    """This rank's new master shard and optimizer state of `bucket`, read from `reader`."""
    start, end = bucket.shard_range(z.groups.member)
    master = torch.zeros(end - start, dtype=torch.float32)
    pieces = []  # (slot, a, c): slot elements [a, c) land at master[offset + a - start ...]
    for s in bucket.slots:
        a, c = max(start, s.offset) - s.offset, min(end, s.offset + s.numel) - s.offset
        if a < c:
            pieces.append((s, a, c))
            master[s.offset + a - start : s.offset + c - start].copy_(reader.read(s.name, a, c))
    scalars, keys = reader.scalar_state(bucket.slots[0].name)
    state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars.items()}
    for key in keys:
        t = torch.zeros(end - start, dtype=torch.float32)
        for s, a, c in pieces:
            t[s.offset + a - start : s.offset + c - start].copy_(reader.read(s.name, a, c, key))
        state[key] = t
    return master, state


def load_checkpoint(path, model, opt=None):
    """Loads the checkpoint directory `path` into `model` and its optimizer, resharding to
    the current world size, stage and shard_size. `opt`: the model's ZeroOptimizer (found
    from the model when omitted), or a plain torch optimizer of a model without ZeRO (its
    state is rebuilt whole), or None for the parameters only. Collective for a
    ZeroOptimizer."""
    reader = _Reader(path)
    z = opt if isinstance(opt, ZeroOptimizer) else OWNERS.get(model)
    if z is None:
        return _load_plain(reader, model, opt)
    saved_groups = reader.meta["param_groups"]
    if len(saved_groups) != len(z._inner.param_groups):
        raise exceptions.InvalidArgumentError(
            "checkpoint %s has %d optimizer param groups, this optimizer %d"
            % (path, len(saved_groups), len(z._inner.param_groups))
        )
    for group, saved in zip(z._inner.param_groups, saved_groups):
        _restore_hyperparameters(group, saved)
    z._inner.state.clear()
    with torch.no_grad():
        for b in z.buckets:
            master, state = _load_bucket(reader, z, b)
            z.master[b.index].copy_(master)
            if state:
                z._inner.state[z.master[b.index]] = state
    model.load_state_dict(reader.rest(), strict=False)
    z._after_load()


def _load_plain(reader, model, opt):
    names = {id(p): n for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in reader.loc:
                p.copy_(reader.full(n))
    model.load_state_dict(reader.rest(), strict=False)
    if opt is None:
        return
    for group, saved in zip(opt.param_groups, reader.meta["param_groups"]):
        _restore_hyperparameters(group, saved)
        for p in group["params"]:
            name = names.get(id(p))
            if name not in reader.loc:
                continue
            scalars, keys = reader.scalar_state(name)
            state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars.items()}
            for key in keys:
                state[key] = reader.full(name, key).clone()
            if state:
                opt.state[p] = state


def full_state_dict(model, rank=None):
    """The consolidated plain state_dict of a model trained with a ZeroOptimizer (fp32
    masters for the parameters it manages): on every rank, or only on global rank `rank`
    (the others get {}). Collective over the optimizer's process set."""
    z = OWNERS.get(model)
    if z is None:
        return model.state_dict() if rank is None or global_rank() == rank else {}
    pending = [
        (b, z.gather_bucket_async(b, "%s.full.%d" % (z.prefix, b.index), fp32=True)) for b in z.buckets
    ]
    values = {}
    for b, wait in pending:
        full = wait()
        for s in b.slots:
            values[s.name] = full[s.offset : s.offset + s.numel].view(s.shape).clone()
    if rank is not None and global_rank() != rank:
        return {}
    rest, keys = checkpoint_io.rest_and_keys(model, _managed_ids(z))
    return {key: values[name] if name is not None else rest[key] for key, name in keys}


def consolidate_checkpoint(path, output_file=None):
    """Builds the plain state_dict a checkpoint directory holds (no running job needed);
    writes it with torch.save when output_file is given. Returns it."""
    reader = _Reader(path)
    rest = reader.rest()
    out = {}
    for key, name in reader.meta["state_keys"]:
        out[key] = reader.full(name).clone() if name is not None else rest[key]
    if output_file is not None:
        torch.save(out, output_file)
    return out
