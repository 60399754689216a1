"""Context (sequence) parallelism: sharding a sequence over the mesh's ``cp`` set and attention
over the whole sequence (attention.py: ulysses and allgather modes and the module; ring.py: ring
mode; auto.py: the measured choice; blocks.py: the float32 block arithmetic every mode shares).
The token layout is framework-neutral (hvdlite.parallel.cp). docs/parallel.md is the user page."""

from hvdlite.torch.parallel.cp.attention import (
    ContextParallelAttention,
    context_parallel_attention,
    cp_shard,
    cp_unshard,
)

__all__ = ["ContextParallelAttention", "context_parallel_attention", "cp_shard", "cp_unshard"]
