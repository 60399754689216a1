"""hvdlite.torch: a drop-in for horovod.torch (``import hvdlite.torch as hvd``).

Every public name of horovod.torch 0.28 is here with the same arguments and
semantics, over hvdlite's framework-neutral core. Collectives take CPU tensors
by pointer (no copy when contiguous). The functions without an ``_async`` or
trailing ``_`` are differentiable.
"""

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
)
from hvdlite.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hvdlite.parallel.mesh import Mesh
from hvdlite.torch import elastic, parallel
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
from hvdlite.torch.parallel import (
    ZeroOptimizer,
    consolidate_checkpoint,
    full_state_dict,
    load_checkpoint,
    save_checkpoint,
)
from hvdlite.torch.sync_batch_norm import SyncBatchNorm
