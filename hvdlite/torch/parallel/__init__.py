"""hvdlite.torch.parallel (``hvd.parallel``): ZeRO, tensor and pipeline parallelism for PyTorch
modules, built only on hvdlite.torch's public collectives. One file (or zero_*.py family) per
technique."""

from hvdlite.torch.parallel.pipeline import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
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
