"""hvdlite.torch.parallel (``hvd.parallel``): ZeRO, tensor, context, pipeline and expert (MoE)
parallelism and sharded embedding tables for PyTorch modules, built only on hvdlite.torch's public
collectives, and MeshState, the elastic state of a mesh job (mesh/). One package per
technique (zero/, tensor/, cp/, pipeline/, moe/, sparse/, mesh/), each re-exporting its public names here; their framework-neutral halves live in hvdlite.parallel."""

from hvdlite.torch.parallel.cp import (
    ContextParallelAttention,
    context_parallel_attention,
    cp_shard,
    cp_unshard,
)
from hvdlite.torch.parallel.mesh import MeshState
from hvdlite.torch.parallel.moe import MoE, expert_parameters, moe_zero_optimizers
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
    load_sparse_checkpoint,
    save_sparse_checkpoint,
)
from hvdlite.torch.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    SequenceParallelLayerNorm,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from hvdlite.torch.parallel.zero import (
    ZeroOptimizer,
    consolidate_checkpoint,
    dcp_to_zero,
    full_state_dict,
    load_checkpoint,
    save_checkpoint,
    wait_checkpoint,
    zero_to_dcp,
)

__all__ = [
    "ColumnParallelLinear",
    "ContextParallelAttention",
    "MeshState",
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
    "context_parallel_attention",
    "cp_shard",
    "cp_unshard",
    "dcp_to_zero",
    "expert_parameters",
    "full_state_dict",
    "load_checkpoint",
    "load_sparse_checkpoint",
    "moe_zero_optimizers",
    "save_checkpoint",
    "save_sparse_checkpoint",
    "vocab_parallel_cross_entropy",
    "wait_checkpoint",
    "zero_to_dcp",
]
