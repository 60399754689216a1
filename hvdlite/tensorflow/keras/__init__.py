"""hvdlite.tensorflow.keras: Horovod's Keras API on TensorFlow
(``import hvdlite.tensorflow.keras as hvd``): the hvdlite.tensorflow names,
plus DistributedOptimizer for Keras optimizers, the callbacks, elastic and
load_model. It works with the Keras that tf.keras is: Keras 3, or Keras 2
(tf_keras) when TF_USE_LEGACY_KERAS=1 is set before TensorFlow is imported
(hvdlite/tensorflow/_keras.py chooses)."""

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
    broadcast_global_variables,
    broadcast_object,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
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
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvdlite.tensorflow.keras import callbacks, elastic
from hvdlite.tensorflow.keras_optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model
