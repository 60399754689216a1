"""Tensor parallelism (Megatron-style): the parallel layers and the vocabulary-parallel loss
(layers.py). docs/parallel.md is the user page."""

from hvdlite.torch.parallel.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    SequenceParallelLayerNorm,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "SequenceParallelLayerNorm",
    "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy",
]
