"""MeshState: the elastic state of a hvd.Mesh job (dp x pp x tp, with ep and cp), which re-forms on
the survivors of a loss through the ordinary ``hvd.elastic.run`` loop::

    mesh = hvd.Mesh(pp=2, tp=2)                    # dp: the rest
    stage, opt = build(mesh)                       # this rank's shard of the model
    state = hvd.parallel.MeshState(mesh, model=stage, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            for replica in state.replicas():       # the original dp replicas this rank computes
                ...forward/backward on replica's batch (gradients accumulate)...
            allreduce the gradients with op=hvd.Sum over mesh.process_set("dp"), divide by
            state.dp_replicas; opt.step(); state.step += 1; state.commit()

What is kept where: each rank keeps (commit(), in host memory, as TorchState does) its own
model and optimizer shard, that of its coordinate (pp, ep, cp, tp); the dp replicas of a
coordinate hold identical copies, which is the only redundancy. sync(), which hvd.elastic.run
calls when the job (re-)forms, does, collectively over the new job:

1. gathers every rank's coordinate and old dp index, and plans the new layout
   (hvdlite/parallel/reform.py): dp shrinks to the largest size the survivors fill, one holder
   per (coordinate, new replica), lowest old dp index first. A coordinate with no survivor is a
   NotSupportedError on every rank (naming it; no disk copy is made: see the last checkpoint).
2. when the plan releases ranks (survivors beyond the new dp, or workers the driver added
   later, which hold nothing: joined_late(), MeshState(None)), rank 0 retires them with the
   elastic driver (hvdlite/runner/elastic_retired.py) and every rank raises
   HostsUpdatedInterrupt: the driver forms the next generation without them, they exit 0 with a
   log line, and sync() runs again on the remaining ranks (so one loss costs two resets).
3. otherwise re-forms the mesh over the job (Mesh.reform: the process sets the layers hold are
   re-pointed in place) and broadcasts model and optimizer from each new dp group's first rank
   (its chosen holder) to the others (exact: hvd.broadcast_optimizer_state runs no step);
   plain values (step, epoch) come from rank 0.

The global batch is kept: replicas() lists the original dp replicas (of dp_replicas) this rank
now computes, so a script that accumulates their gradients and divides the dp sum by
dp_replicas trains on the same batches with the same arithmetic, up to summation order.
Contract: construct it on every rank after the mesh, model and optimizer; a rank's coordinate
never changes (survivors keep their shard), so layers built for it stay valid.
"""

import sys

import torch

from hvdlite.common.exceptions import HostsUpdatedInterrupt, NotSupportedError
from hvdlite.common.objects import allgather_object
from hvdlite.common.topology import rank
from hvdlite.elastic import worker
from hvdlite.elastic.state import ObjectState
from hvdlite.parallel import reform
from hvdlite.parallel.mesh import Mesh
from hvdlite.torch.diloco import DiLoCo
from hvdlite.torch.elastic.state import TorchState
from hvdlite.torch.functions import broadcast_optimizer_state, broadcast_parameters


class MeshState(TorchState):
    """TorchState of a mesh job: ``MeshState(mesh, model=..., optimizer=..., step=0, ...)``.
    Keywords as TorchState's (modules and optimizers: this rank's shards); see the module doc."""

    mesh: Mesh
    dp_replicas: int
    _held: tuple[tuple[int, ...], int]  # (this rank's coordinate, its dp index) in the last layout
    _sizes: dict[str, int]
    _lost_from: dict[tuple[int, ...], list[int]]

    def __init__(self, mesh, model=None, optimizer=None, **kwargs):
        if any(isinstance(v, DiLoCo) for v in (model, optimizer, *kwargs.values())):
            raise NotSupportedError("MeshState does not take hvd.DiLoCo; use TorchState for local SGD")
        object.__setattr__(self, "mesh", mesh)  # None: a worker that joined late (joined_late())
        object.__setattr__(self, "dp_replicas", mesh.size("dp") if mesh else 0)  # the dp the job started with
        held = (reform.key_of(mesh.coords), mesh.coords.dp) if mesh else None
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_sizes", dict(mesh.sizes) if mesh else None)  # the last sync's layout
        object.__setattr__(self, "_lost_from", {})
        super().__init__(model, optimizer, **kwargs)

    @staticmethod
    def joined_late():
        """Whether the elastic driver started this worker after the job's first generation (a
        host found or returned later). Such a worker holds no shard: it builds no mesh and no
        model, makes ``MeshState(None)`` and calls the run function, whose sync() releases it
        (it exits 0). Call after hvd.init()."""
        ctx = worker.context()
        return ctx is not None and ctx.started_in() > 1

    def replicas(self):
        """The original dp replicas (0..dp_replicas-1) whose batches this rank computes now: its
        own alone before any loss; after dp shrank, every dp-th one from its new dp index."""
        dp, me = self.mesh.size("dp"), self.mesh.rank("dp")
        return [v for v in range(self.dp_replicas) if v % dp == me]

    def sync(self):
        self._reform()
        if self.mesh.size("dp") > 1:
            root, dp = self.mesh.ranks("dp")[0], self.mesh.process_set("dp")
            for handler in self._handlers.values():
                value = handler.value
                if isinstance(value, torch.nn.Module):
                    broadcast_parameters(value.state_dict(), root_rank=root, process_set=dp)
                elif isinstance(value, torch.optim.Optimizer):
                    broadcast_optimizer_state(value, root_rank=root, process_set=dp)
        for handler in self._handlers.values():
            if not isinstance(handler.value, (torch.nn.Module, torch.optim.Optimizer)):
                handler.sync()  # samplers: from rank 0, as TorchState
        ObjectState.sync(self)

    def _reform(self):
        """Steps 1-3 of the module doc, up to the broadcasts."""
        ctx = worker.context()
        wid = ctx.worker_id if ctx is not None else None
        every = allgather_object((self._held, wid, self._sizes), name="mesh_state.holders")
        holders = {r: held for r, (held, _, _) in enumerate(every)}
        sizes = next((theirs for _, _, theirs in every if theirs), None)
        if sizes is None:
            raise NotSupportedError("MeshState: no rank of the job holds a mesh shard")
        object.__setattr__(self, "_sizes", sizes)  # a late worker learns them here
        lost_from = self._lost_from or (_holders_of(self.mesh) if self.mesh else {})
        plan = reform.plan(self._sizes, holders, lost_from)
        if plan.released:
            self._release(plan, [every[r][1] for r in plan.released], ctx)
        layout = self.mesh.layout
        if plan.members != layout.members or plan.dp != layout.sizes["dp"] or not self.mesh.registered():
            self.mesh.reform(plan.members, plan.dp)
        object.__setattr__(self, "_held", (reform.key_of(self.mesh.coords), self.mesh.coords.dp))
        object.__setattr__(self, "_sizes", dict(self.mesh.sizes))
        object.__setattr__(self, "_lost_from", _holders_of(self.mesh))

    def _release(self, plan, worker_ids, ctx):
        """Retires plan.released (rank 0 tells the driver) and raises HostsUpdatedInterrupt on
        every rank, so the job re-forms without them (module doc, step 2)."""
        text = "mesh %s re-forms with dp=%d on %d rank(s); released: rank(s) %s (worker(s) %s)" % (
            _sizes_text(self._sizes),
            plan.dp,
            len(plan.members),
            plan.released,
            ", ".join(map(str, worker_ids)),
        )
        if ctx is None:
            raise NotSupportedError(text + ": releasing ranks needs the elastic driver (hvdliterun --min-np)")
        if rank() in plan.released:
            sys.stderr.write("hvdlite.elastic: %s; this rank leaves the job (exit status 0)\n" % text)
        elif rank() == 0:
            sys.stderr.write("hvdlite.elastic: %s\n" % text)
        if rank() == 0:
            ctx.retire(worker_ids)
        raise HostsUpdatedInterrupt(skip_sync=False)


def _holders_of(mesh):
    """{coordinate: the global ranks that hold it} of the mesh's current layout."""
    out: dict[tuple[int, ...], list[int]] = {}
    for r in mesh.layout.members:
        out.setdefault(reform.key_of(mesh.layout.coords_of(r)), []).append(r)
    return out


def _sizes_text(sizes):
    return "(%s)" % ", ".join("%s=%d" % (a, sizes[a]) for a in ("pp", "dp", "ep", "cp", "tp"))
