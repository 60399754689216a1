"""One rank of sparse_embeddings.py's TorchRec row, run by another interpreter (--torchrec-python:
a venv with torchrec and fbgemm-gpu-cpu built for its torch; docs/sparse.md says which pair
loads): the same DLRM, data and SGD steps as _sparse_worker.py, with TorchRec holding the
tables.

    PY _torchrec_worker.py --lib gloo --out DIR --mode torchrec --steps S --idle-wait W
        [--batch B --dim D --min-rows R --max-rows R]

The 26 tables are one torchrec.EmbeddingBagCollection placed by TorchRec's planner for a CPU
topology of the job's size (EmbeddingShardingPlanner.collective_plan) and sharded by
DistributedModelParallel over the gloo process group (ids and pooled embeddings by all-to-all);
the tables' SGD is fused into the backward (apply_optimizer_in_backward, FBGEMM's kernels), the
dense part is DDP-wrapped by DistributedModelParallel with torch.optim.SGD. Bytes sent are not
counted (TorchRec exposes no counter); table bytes per rank are this rank's local shards.
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from _sparse_worker import LR, _add, time_dlrm_steps  # noqa: E402
from _worker import run, step_doc  # noqa: E402
from dlrm_sparse import DLRM, table_rows  # noqa: E402


class TorchRecTables(torch.nn.Module):
    """{"f<i>": ids [batch, 1]} -> {"f<i>": pooled [batch, dim]} through one EmbeddingBagCollection."""

    def __init__(self, rows, dim):
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

        super().__init__()
        self.keys = ["f%d" % i for i in range(len(rows))]
        configs = [
            EmbeddingBagConfig(name="t" + k, embedding_dim=dim, num_embeddings=n, feature_names=[k])
            for k, n in zip(self.keys, rows)
        ]
        self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))

    def forward(self, ids):
        from torchrec import KeyedJaggedTensor

        values = torch.cat([ids[k].reshape(-1) for k in self.keys])
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.keys, values=values, lengths=torch.ones(values.numel(), dtype=torch.int32)
        )
        return self.ebc(kjt).to_dict()


def _model(comm, rows, dim):
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    torch.manual_seed(0)
    model = DLRM(TorchRecTables(rows, dim), dim)
    apply_optimizer_in_backward(torch.optim.SGD, model.embeddings.ebc.parameters(), {"lr": LR})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=comm.size, compute_device="cpu"))
    plan = planner.collective_plan(model, None, comm.dist.group.WORLD)
    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    opt = KeyedOptimizerWrapper(dense, lambda params: torch.optim.SGD(params, lr=LR))
    return model, opt, plan


def _local_table_bytes(model):
    total = 0
    for key, value in model.state_dict().items():
        if "embedding_bags" not in key:
            continue
        shards = value.local_shards() if hasattr(value, "local_shards") else []
        total += sum(s.tensor.numel() * s.tensor.element_size() for s in shards)
    return total


def measure(comm, gate, args):
    rows = table_rows(args.min_rows, args.max_rows)
    model, opt, plan = _model(comm, rows, args.dim)
    times, load, _ = time_dlrm_steps(comm, gate, model, opt, rows, args)
    import torchrec

    shardings = sorted({p.sharding_type for m in plan.plan.values() for p in m.values()})
    return step_doc(
        comm,
        times,
        load,
        sent=None,
        table_bytes=_local_table_bytes(model),
        torchrec="torchrec %s, shardings %s" % (getattr(torchrec, "__version__", "?"), "/".join(shardings)),
    )


def main():
    run(measure, add=_add, setup=lambda: torch.set_num_threads(1))


if __name__ == "__main__":
    sys.exit(main())
