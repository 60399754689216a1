"""ZeRO for models with MoE layers: the expert parameters sharded over their own
expert-data-parallel set, the others over the full data-parallel set.

    dense, experts = hvd.parallel.moe_zero_optimizers(
        model, lambda params: torch.optim.AdamW(params, lr=1e-3), stage=2,
        process_set=mesh.process_set(("dp", "ep")))
    loss.backward(); dense.step(); experts.step(); dense.zero_grad(); experts.zero_grad()

Two optimizers (construction is collective over both sets, in this order on every rank):
`dense` is a ZeroOptimizer over the parameters MoE did not mark; `experts` a ZeroOptimizer
over the marked ones (``p.hvd_process_set``, which must be one set for all of them) on that
set, so expert optimizer state is sharded too, or the plain optimizer when the mark is None
(experts not replicated). An expert gradient already sums the other ep members'
contributions (through the all-to-all), so a hook scales it, before it is accumulated, by
(expert set size / process_set size): after averaging over the expert set it is the same
gradient DistributedOptimizer gives. Stages 1 and 2 only (stage 3's per-module gathering of
two optimizers on one model is untested). Checkpoint helpers (hvd.save_checkpoint ...) find
only the last ZeroOptimizer built on a model, which is `experts` when it is one.
"""

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch.parallel.zero.optimizer import ZeroOptimizer


def moe_zero_optimizers(model, optimizer_factory, stage=1, process_set=None, **zero_kwargs):
    """(dense, experts) optimizers of `model`; optimizer_factory(params) builds a torch
    optimizer (elementwise, as ZeroOptimizer requires) over a list of parameters."""
    if stage not in (1, 2):
        raise exceptions.NotSupportedError("moe_zero_optimizers: stage 1 or 2, got %r" % (stage,))
    full = process_set if process_set is not None else global_process_set
    marked = [p for p in model.parameters() if hasattr(p, "hvd_process_set")]
    dense_params = [p for p in model.parameters() if not hasattr(p, "hvd_process_set")]
    sets = {id(p.hvd_process_set): p.hvd_process_set for p in marked}
    if len(sets) > 1:
        raise exceptions.NotSupportedError(
            "moe_zero_optimizers: expert parameters marked with %d different process sets; one is supported"
            % len(sets)
        )
    expert_set = next(iter(sets.values())) if sets else None
    scale = (expert_set.size() if expert_set is not None else 1) / full.size()
    for p in marked:
        if scale != 1.0:
            p.register_hook(lambda g, s=scale: g * s)
    dense = ZeroOptimizer(
        optimizer_factory(dense_params), model, stage=stage, process_set=full, **zero_kwargs
    )
    if not marked:
        return dense, None
    if expert_set is None:
        return dense, optimizer_factory(marked)
    experts = ZeroOptimizer(
        optimizer_factory(marked), model, stage=stage, process_set=expert_set, **zero_kwargs
    )
    return dense, experts
