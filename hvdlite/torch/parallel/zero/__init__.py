"""ZeRO stages 1-3 (``hvd.ZeroOptimizer``) and its resharding checkpoints: the flat-buffer
layout and sharding groups (shard.py), the optimizer (optimizer.py), stage 3's parameter
gathering (stage3.py), checkpoints that load at any world size (checkpoint.py) and their
conversion to and from torch.distributed.checkpoint (dcp.py), elastic training's buddy copies and
resharding after a re-form (elastic.py). docs/zero.md is the user page."""

from hvdlite.torch.parallel.zero.checkpoint import (
    consolidate_checkpoint,
    full_state_dict,
    load_checkpoint,
    save_checkpoint,
    wait_checkpoint,
)
from hvdlite.torch.parallel.zero.dcp import dcp_to_zero, zero_to_dcp
from hvdlite.torch.parallel.zero.optimizer import ZeroOptimizer

__all__ = [
    "ZeroOptimizer",
    "consolidate_checkpoint",
    "dcp_to_zero",
    "full_state_dict",
    "load_checkpoint",
    "save_checkpoint",
    "wait_checkpoint",
    "zero_to_dcp",
]
