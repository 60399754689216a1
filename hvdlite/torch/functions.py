"""Broadcasting model and optimizer state from one rank (Horovod's
broadcast_parameters / broadcast_optimizer_state), plus the object
collectives shared with every adapter."""

import collections
import inspect

import torch

from hvdlite.common import exceptions
from hvdlite.common.compressors import STATE_KEY
from hvdlite.common.objects import allgather_object, broadcast_object
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch import mpi_ops


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every tensor in `params` with root_rank's value, in place.

    `params`: a dict such as model.state_dict() (broadcast in sorted-name order)
    or a list (or generator) of tensors or of (name, tensor) pairs such as
    model.named_parameters()."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or inspect.isgenerator(params):  # e.g. model.named_parameters()
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise exceptions.InvalidArgumentError("invalid params of type: %s" % type(params))
    handles = [mpi_ops.broadcast_async_(p, root_rank, name, process_set=process_set) for name, p in items]
    for handle in handles:
        mpi_ops.synchronize(handle)


def _sparse_param_ids(model):
    """ids of the parameters of `model`'s sparse embeddings (Horovod's use of `model`)."""
    if model is None:
        return set()
    return {
        id(p)
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and m.sparse
        for p in m.parameters()
    }


def _initialize_state(optimizer, sparse_ids=frozenset()):
    """Creates the state of an optimizer that has not stepped yet, with a step
    on zero gradients (Horovod's way), so that every rank has tensors of the
    root's shapes to receive into. Gradients are sparse for SparseAdam and, under
    SGD, for the parameters in `sparse_ids`."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                    isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_ids
                ):
                    p.grad = p.grad.to_sparse()
    if getattr(optimizer, "_hvdlite_distributed", False):
        # A DistributedOptimizer's step() would allreduce; step the wrapped class only.
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (hyperparameters of each param group
    and per-parameter state) equal to root_rank's. `model` (optional, Horovod's
    argument) names the sparse embeddings whose state starts from sparse gradients.

    State tensors are broadcast in place; everything else (learning rates,
    betas, step counts kept as numbers, flags) travels as one pickled object.
    The hyperparameters of a stateless optimizer (plain SGD) are broadcast too. A
    stateful compressor's shared state (step counters, PowerSGD's Q) comes from the root
    too; its residuals are each rank's own and stay."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise exceptions.InvalidArgumentError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _initialize_state(optimizer, _sparse_param_ids(model))
        state_dict = optimizer.state_dict()
    tensors: list[tuple[str, torch.Tensor]] = []
    groups: list[dict[str, object]] = []
    states: dict[tuple[int, str], object] = {}
    occurrences: collections.defaultdict[str, int] = collections.defaultdict(int)
    for _index, group in enumerate(state_dict["param_groups"]):
        groups.append({k: v for k, v in group.items() if k != "params"})
        for pid in group["params"]:
            for key, value in state_dict["state"].get(pid, {}).items():
                occurrences[key] += 1
                if torch.is_tensor(value):
                    tensors.append(("%s.%d" % (key, occurrences[key]), value))
                else:
                    states[(pid, key)] = value
    plain = {"groups": groups, "state": states}
    if STATE_KEY in state_dict:
        plain["compression_shared"] = state_dict[STATE_KEY]["shared"]
    plain = broadcast_object(plain, root_rank, name="optimizer_state.plain", process_set=process_set)
    if STATE_KEY in state_dict and "compression_shared" in plain:
        state_dict[STATE_KEY] = {
            "local": state_dict[STATE_KEY]["local"],
            "shared": plain["compression_shared"],
        }
    broadcast_parameters(tensors, root_rank, process_set)
    for group, options in zip(state_dict["param_groups"], plain["groups"]):
        group.update(options)
    for (pid, key), value in plain["state"].items():
        state_dict["state"][pid][key] = value
    optimizer.load_state_dict(state_dict)


__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]
