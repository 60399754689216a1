"""hvdlite.tensorflow: a drop-in for horovod.tensorflow on TensorFlow 2 and
Keras 3 (``import hvdlite.tensorflow as hvd``).

Horovod's names, arguments and semantics over hvdlite's framework-neutral
core: collectives run eagerly or inside tf.function and tf.compat.v1 graphs
(as numpy_functions around one small asynchronous kernel, HvdliteAwait, built
against the installed TensorFlow, so a waiting collective holds no executor
thread; without that kernel, as one blocking numpy_function) and are
differentiable. XLA (jit_compile=True) cannot contain them.
"""

from hvdlite.common.basics import (
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
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
from hvdlite.common.util import (
    check_extension,
    check_num_rank_power_of_2,
    gpu_available,
    handle_average_backwards_compatibility,
    split_list,
)
from hvdlite.tensorflow import elastic
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.functions import (
    BroadcastGlobalVariablesHook,
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from hvdlite.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from hvdlite.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from hvdlite.tensorflow.mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from hvdlite.tensorflow.optimizer import DistributedOptimizer
from hvdlite.tensorflow.p2p_ops import (
    P2POp,
    batch_isend_irecv,
    poll,
    recv,
    recv_async,
    send,
    send_async,
    synchronize,
)
from hvdlite.tensorflow.queries import (
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from hvdlite.tensorflow.sync_batch_norm import SyncBatchNormalization

# _executing_eagerly: private, but Horovod's tests and user code call hvd._executing_eagerly().
from hvdlite.tensorflow.util import _cache, _executing_eagerly, _make_subgraph, refs_to_vars, vars_to_refs

__all__ = [
    "Adasum",
    "Average",
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HvdliteError",
    "HvdliteInternalError",
    "HvdliteTimeoutError",
    "InvalidArgumentError",
    "LocalGradientAggregationHelper",
    "Max",
    "Min",
    "MismatchError",
    "NotSupportedError",
    "P2POp",
    "PartialDistributedGradientTape",
    "PreconditionError",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "check_extension",
    "check_num_rank_power_of_2",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "gpu_available",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "handle_average_backwards_compatibility",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "process_set_included_op",
    "rank",
    "rank_op",
    "recv",
    "recv_async",
    "reducescatter",
    "refs_to_vars",
    "remove_process_set",
    "rocm_built",
    "send",
    "send_async",
    "shutdown",
    "size",
    "size_op",
    "split_list",
    "start_timeline",
    "stop_timeline",
    "synchronize",
    "vars_to_refs",
]
