"""hvdlite: Horovod-compatible distributed training.

``import hvdlite as hvd`` is the framework-agnostic NumPy API; framework
adapters live in ``hvdlite.torch`` and ``hvdlite.tensorflow``.
"""

from hvdlite import elastic
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
from hvdlite.common.ops import join, poll, synchronize
from hvdlite.common.p2p import P2POp
from hvdlite.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hvdlite.numpy_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    recv,
    recv_async,
    reducescatter,
    reducescatter_async,
    send,
    send_async,
)

__version__ = "0.1.0"
