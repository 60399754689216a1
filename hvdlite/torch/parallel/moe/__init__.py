"""Mixture of Experts with expert parallelism (``hvd.parallel.MoE``): the layer (layer.py),
running a member's local experts (experts.py) and ZeRO for MoE models (zero.py). docs/moe.md is
the user page."""

from hvdlite.torch.parallel.moe.layer import MoE, expert_parameters
from hvdlite.torch.parallel.moe.zero import moe_zero_optimizers

__all__ = ["MoE", "expert_parameters", "moe_zero_optimizers"]
