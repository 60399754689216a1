"""hvdlite.parallel: framework-neutral building blocks of model parallelism: the device mesh
(process sets for pipeline, data, expert, context and tensor parallel axes) and pipeline schedules as
checked per-rank action lists. The framework layers (hvdlite.torch.parallel) run them."""

from hvdlite.parallel.mesh import AXES, Mesh, MeshCoords, MeshLayout
from hvdlite.parallel.schedules import SCHEDULES, Action, PipelineSchedule, ScheduleError, build, check

__all__ = [
    "AXES",
    "SCHEDULES",
    "Action",
    "Mesh",
    "MeshCoords",
    "MeshLayout",
    "PipelineSchedule",
    "ScheduleError",
    "build",
    "check",
]
