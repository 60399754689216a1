"""Parallelism add-ons for PyTorch built only on hvdlite.torch's public collectives
(ARCHITECTURE.md): ZeRO (zero_*.py)."""

from hvdlite.torch.parallel.zero_checkpoint import (
    consolidate_checkpoint,
    full_state_dict,
    load_checkpoint,
    save_checkpoint,
)
from hvdlite.torch.parallel.zero_optimizer import ZeroOptimizer

__all__ = ["ZeroOptimizer", "consolidate_checkpoint", "full_state_dict", "load_checkpoint", "save_checkpoint"]
