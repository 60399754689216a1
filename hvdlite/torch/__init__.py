"""hvdlite.torch: a drop-in for horovod.torch (``import hvdlite.torch as hvd``).

Every public name of horovod.torch 0.28 is here with the same arguments and
semantics, over hvdlite's framework-neutral core. Collectives take CPU tensors
by pointer (no copy when contiguous). The functions without an ``_async`` or
trailing ``_`` are differentiable.
"""

import importlib as _importlib

import torch as _torch

from hvdlite.common.basics import (
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvdlite.common.capabilities import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from hvdlite.common.dtypes import Adasum, Average, Max, Min, Product, Sum
from hvdlite.common.exceptions import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HvdliteError,
    HvdliteInternalError,
    HvdliteTimeoutError,
    InvalidArgumentError,
    MismatchError,
    NotSupportedError,
    PreconditionError,
    ShardsLostError,
)
from hvdlite.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hvdlite.common.util import register_gpu_check
from hvdlite.torch import elastic
from hvdlite.torch.autograd_ops import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from hvdlite.torch.compression import Compression
from hvdlite.torch.diloco import DiLoCo
from hvdlite.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvdlite.torch.mpi_ops import (
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hvdlite.torch.optimizer import DistributedOptimizer
from hvdlite.torch.p2p_ops import P2POp, batch_isend_irecv, recv, recv_async, send, send_async
from hvdlite.torch.sync_batch_norm import SyncBatchNorm
from hvdlite.torch_backend import register as _register_torch_backend

# The add-on layer (hvdlite/torch/parallel/, hvdlite/parallel/) is built on this adapter, so the
# adapter never imports it at import time: these names load it on first use (PEP 562), and
# `import hvdlite.torch` stays free of ZeRO, pipeline, MoE and mesh code (tests/test_layering.py).
_ADDON_NAMES = {
    "parallel": ("hvdlite.torch.parallel", None),
    "Mesh": ("hvdlite.parallel.mesh", "Mesh"),
    "ZeroOptimizer": ("hvdlite.torch.parallel", "ZeroOptimizer"),
    "consolidate_checkpoint": ("hvdlite.torch.parallel", "consolidate_checkpoint"),
    "full_state_dict": ("hvdlite.torch.parallel", "full_state_dict"),
    "load_checkpoint": ("hvdlite.torch.parallel", "load_checkpoint"),
    "save_checkpoint": ("hvdlite.torch.parallel", "save_checkpoint"),
    "wait_checkpoint": ("hvdlite.torch.parallel", "wait_checkpoint"),
}


def __getattr__(name):
    if name not in _ADDON_NAMES:
        raise AttributeError("module 'hvdlite.torch' has no attribute %r" % name)
    module_name, attr = _ADDON_NAMES[name]
    module = _importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_ADDON_NAMES))


def _check_has_gpu():
    """Whether torch sees a CUDA GPU (the hook behind hvdlite.common.util.gpu_available)."""
    return bool(_torch.cuda.is_available())


register_gpu_check("torch", _check_has_gpu)

# torch.distributed's "hvdlite" backend (hvdlite.torch_backend): dist.init_process_group("hvdlite").
_register_torch_backend()
