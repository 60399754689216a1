"""start_timeline / stop_timeline (Horovod's names), shared by every adapter.

The timeline (a Chrome-trace JSON of every tensor's negotiation and
collective phases) is a feature of the C++ core. Until the core exposes it,
both calls raise NotSupportedError naming what is missing.
"""
from hvdlite import _core
from hvdlite.common import exceptions


def _require_core_timeline():
    if not hasattr(_core, "start_timeline"):
        raise exceptions.NotSupportedError(
            "this build of the hvdlite core has no timeline; start_timeline/stop_timeline need a newer core")


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the timeline to `file_path` (Chrome trace format); with
    mark_cycles, also marks each background-loop cycle."""
    _require_core_timeline()
    code, message = _core.start_timeline(str(file_path), bool(mark_cycles))
    exceptions.raise_for_status(code, message)


def stop_timeline():
    """Stops writing the timeline and closes its file."""
    _require_core_timeline()
    code, message = _core.stop_timeline()
    exceptions.raise_for_status(code, message)
