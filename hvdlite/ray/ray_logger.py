"""Horovod's horovod.ray.ray_logger: a worker sends values to the driver's `callbacks`.

Worker side only. `log(info_dict)` puts the value on the job's callback queue (a Ray queue actor
that the executor hands each worker through BaseHorovodWorker.set_queue, or the elastic worker's
run, when run()/execute() was given callbacks); the driver calls every callback with every value,
in the order the queue received them (hvdlite/ray/callbacks.py). log() blocks until the queue
actor holds the value, so a value logged before the function returns reaches the callbacks before
run() returns. Without a queue (no callbacks given) log() warns once and drops the value, as
Horovod's does. Module state is per worker process (a Ray actor's process runs one worker).
"""

import warnings
from typing import Any

_queue: Any = None
_queue_set = False
warning_raised = False


def configure(queue: Any) -> None:
    """Sets this process's callback queue (None: drop what log() gets)."""
    global _queue, _queue_set
    _queue = queue
    _queue_set = queue is not None


def log(info_dict: Any) -> None:
    """Sends info_dict (any picklable value) to the driver's callbacks; blocks until queued."""
    global warning_raised
    if _queue_set:
        _queue.put(info_dict)
    elif not warning_raised:
        warnings.warn("`ray_logger.log` called but logging is not configured.", stacklevel=2)
        warning_raised = True
