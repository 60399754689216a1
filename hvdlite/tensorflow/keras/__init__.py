"""hvdlite.tensorflow.keras: Horovod's Keras API for Keras 3 on TensorFlow
(``import hvdlite.tensorflow.keras as hvd``): the hvdlite.tensorflow names,
plus DistributedOptimizer for Keras 3 optimizers, the callbacks and
load_model."""

from hvdlite.tensorflow import (
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_object,
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    reducescatter,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvdlite.tensorflow.keras import callbacks, elastic
from hvdlite.tensorflow.keras_optimizer import DistributedOptimizer, load_model
