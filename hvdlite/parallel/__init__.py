"""hvdlite.parallel: framework-neutral building blocks of model parallelism, one module per
concern: the device mesh (mesh.py: process sets for pipeline, data, expert, context and tensor
parallel axes), pipeline schedules as checked per-rank action lists (schedules.py), where a
sequence's tokens live under context parallelism (cp.py) and where embedding tables' rows live
and how they are planned (sparse.py). The framework layers (hvdlite.torch.parallel) run them."""

from hvdlite.parallel.mesh import AXES, Mesh, MeshCoords, MeshLayout
from hvdlite.parallel.schedules import SCHEDULES, Action, PipelineSchedule, ScheduleError, build, check
from hvdlite.parallel.sparse import TableLayout, plan_tables

__all__ = [
    "AXES",
    "SCHEDULES",
    "Action",
    "Mesh",
    "MeshCoords",
    "MeshLayout",
    "PipelineSchedule",
    "ScheduleError",
    "TableLayout",
    "build",
    "check",
    "plan_tables",
]
