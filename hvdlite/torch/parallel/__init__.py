"""hvdlite.torch.parallel (``hvd.parallel``): ZeRO, tensor, pipeline and expert (MoE) parallelism
and sharded embedding tables for PyTorch modules, built only on hvdlite.torch's public
collectives. One file (or name_*.py family) per technique."""

from hvdlite.torch.parallel.moe import MoE, expert_parameters
from hvdlite.torch.parallel.moe_zero import moe_zero_optimizers
from hvdlite.torch.parallel.pipeline import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from hvdlite.torch.parallel.sparse import (
    ShardedEmbedding,
    ShardedEmbeddingBag,
    ShardedEmbeddingCollection,
    TableSpec,
)
from hvdlite.torch.parallel.sparse_checkpoint import load_sparse_checkpoint, save_sparse_checkpoint
from hvdlite.torch.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    SequenceParallelLayerNorm,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from hvdlite.torch.parallel.zero_checkpoint import (
    consolidate_checkpoint,
    full_state_dict,
    load_checkpoint,
    save_checkpoint,
)
from hvdlite.torch.parallel.zero_optimizer import ZeroOptimizer

__all__ = [
    "ColumnParallelLinear",
    "MoE",
    "PipelineStage",
    "RowParallelLinear",
    "Schedule1F1B",
    "ScheduleGPipe",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
    "SequenceParallelLayerNorm",
    "ShardedEmbedding",
    "ShardedEmbeddingBag",
    "ShardedEmbeddingCollection",
    "TableSpec",
    "VocabParallelEmbedding",
    "ZeroOptimizer",
    "consolidate_checkpoint",
    "expert_parameters",
    "full_state_dict",
    "load_checkpoint",
    "load_sparse_checkpoint",
    "moe_zero_optimizers",
    "save_checkpoint",
    "save_sparse_checkpoint",
    "vocab_parallel_cross_entropy",
]
