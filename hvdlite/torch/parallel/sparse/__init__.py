"""Sharded embedding tables (``hvd.parallel.ShardedEmbeddingBag`` and friends): the modules
(embedding.py), the id/row/gradient exchange (exchange.py), fused row optimizers (optim.py),
bag pooling (pool.py), resharding checkpoints (checkpoint.py) and re-forming over a new elastic
world (elastic.py). The table layouts and the planner are framework-neutral (hvdlite.parallel.sparse:
``hvdlite.parallel.TableLayout``, ``hvdlite.parallel.plan_tables``). docs/sparse.md is the user
page."""

from hvdlite.torch.parallel.sparse.checkpoint import load_sparse_checkpoint, save_sparse_checkpoint
from hvdlite.torch.parallel.sparse.embedding import (
    ShardedEmbedding,
    ShardedEmbeddingBag,
    ShardedEmbeddingCollection,
    TableSpec,
)

__all__ = [
    "ShardedEmbedding",
    "ShardedEmbeddingBag",
    "ShardedEmbeddingCollection",
    "TableSpec",
    "load_sparse_checkpoint",
    "save_sparse_checkpoint",
]
