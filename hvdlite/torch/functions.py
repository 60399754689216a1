"""Broadcasting model and optimizer state from one rank (Horovod's
broadcast_parameters / broadcast_optimizer_state), plus the object
collectives shared with every adapter."""

import inspect

import torch

from hvdlite.common import exceptions, topology
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


def _zero_grads(optimizer, sparse_ids=frozenset()):
    """Gives every parameter that requires a gradient and has none a zero gradient, as Horovod's
    broadcast leaves them (its tests read them). A backward adds to it exactly, so the next step
    is the one a fresh optimizer would take; nothing steps here. Gradients are sparse where a
    backward makes them sparse: under SparseAdam, and for the parameters in `sparse_ids`."""
    sparse_all = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                grad = torch.zeros_like(p)
                p.grad = grad.to_sparse() if sparse_all or id(p) in sparse_ids else grad


def _layout(optimizer, state_dict):
    """The root's state as ({param index: [(key, spec)]}, [(name, tensor)]): a spec is
    ("tensor", shape, dtype, on_cpu) for a tensor (on_cpu: kept on the CPU while its parameter
    is not, like a step count) or ("value", v) for anything else. Parameters without state
    have no entry. Tensors are listed in the layout's order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    layout: dict[int, list[tuple[str, tuple[object, ...]]]] = {}
    tensors: list[tuple[str, torch.Tensor]] = []
    for group in state_dict["param_groups"]:
        for pid in group["params"]:
            entries: list[tuple[str, tuple[object, ...]]] = []
            for key, value in state_dict["state"].get(pid, {}).items():
                if torch.is_tensor(value):
                    on_cpu = value.device.type == "cpu" and params[pid].device.type != "cpu"
                    entries.append((key, ("tensor", tuple(value.shape), value.dtype, on_cpu)))
                    tensors.append(("optimizer_state.%d.%s" % (pid, key), value))
                else:
                    entries.append((key, ("value", value)))
            if entries:
                layout[pid] = entries
    return layout, tensors


def _receivers(optimizer, layout):
    """A state dict shaped as the root's `layout`, its tensors empty (to broadcast into), and
    those tensors as [(name, tensor)] in the layout's order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, object]] = {}
    tensors: list[tuple[str, torch.Tensor]] = []
    for pid, entries in layout.items():
        if pid >= len(params):
            raise exceptions.InvalidArgumentError(
                "broadcast_optimizer_state: the root's optimizer has state for parameter %d, but this "
                "rank's has %d parameters: build the same model and optimizer on every rank"
                % (pid, len(params))
            )
        state[pid] = {}
        for key, spec in entries:
            if spec[0] == "tensor":
                _, shape, dtype, on_cpu = spec
                device = torch.device("cpu") if on_cpu else params[pid].device
                tensor = torch.empty(shape, dtype=dtype, device=device)
                state[pid][key] = tensor
                tensors.append(("optimizer_state.%d.%s" % (pid, key), tensor))
            else:
                state[pid][key] = spec[1]
    return state, tensors


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (hyperparameters of each param group
    and per-parameter state) equal to root_rank's. `model` (optional, Horovod's
    argument) names the sparse embeddings whose gradients are sparse.

    Exact, unlike Horovod (horovod#2805): no optimizer step runs. The root's state
    travels as is: its layout and plain values (step counts kept as numbers, flags)
    as one pickled object with the hyperparameters, its tensors broadcast into
    tensors of the same shapes. A rank ends with exactly the root's state; where the
    root has none (an optimizer that has not stepped yet), with none, as a freshly
    built optimizer. The root's own optimizer is left untouched. A rank whose state
    was empty gets zero gradients where it had none (_zero_grads), as Horovod leaves them.
    A stateful compressor's shared state (step counters, PowerSGD's Q) comes from the root
    too; its residuals are each rank's own and stay."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise exceptions.InvalidArgumentError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _zero_grads(optimizer, _sparse_param_ids(model))
    is_root = topology.rank() == root_rank
    groups = [{k: v for k, v in group.items() if k != "params"} for group in state_dict["param_groups"]]
    layout, tensors = _layout(optimizer, state_dict) if is_root else ({}, [])
    plain = {"groups": groups, "layout": layout}
    if STATE_KEY in state_dict:
        plain["compression_shared"] = state_dict[STATE_KEY]["shared"]
    plain = broadcast_object(plain, root_rank, name="optimizer_state.plain", process_set=process_set)
    if not is_root:
        if len(plain["groups"]) != len(state_dict["param_groups"]):
            raise exceptions.InvalidArgumentError(
                "broadcast_optimizer_state: the root's optimizer has %d param groups, this rank's %d"
                % (len(plain["groups"]), len(state_dict["param_groups"]))
            )
        state, tensors = _receivers(optimizer, plain["layout"])
    broadcast_parameters(tensors, root_rank, process_set)
    if is_root:
        return
    param_groups = [
        dict(options, params=group["params"])
        for group, options in zip(state_dict["param_groups"], plain["groups"])
    ]
    loaded = {"state": state, "param_groups": param_groups}
    if STATE_KEY in state_dict and "compression_shared" in plain:
        loaded[STATE_KEY] = {"local": state_dict[STATE_KEY]["local"], "shared": plain["compression_shared"]}
    optimizer.load_state_dict(loaded)


__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]
