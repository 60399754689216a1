"""Pipeline parallelism with torch.distributed.pipelining's names: the stage and schedule
runtime (runtime.py) and the stage-to-stage tensor transfer on the core's point-to-point
(transfer.py). The schedules themselves are framework-neutral action lists
(hvdlite.parallel.schedules). docs/parallel.md is the user page."""

from hvdlite.torch.parallel.pipeline.runtime import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

__all__ = [
    "PipelineStage",
    "Schedule1F1B",
    "ScheduleGPipe",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
]
