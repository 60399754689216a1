"""The driver side of Horovod's Ray callbacks (`callbacks=` of run/execute): every value a worker
logs with hvdlite.ray.ray_logger.log is passed to every callback, in the driver's process.

CallbackQueue(callbacks) is a context manager around one call of run()/execute():
  - with callbacks, it creates a Ray queue actor (no CPU, on the driver's node where it can be)
    and a daemon thread that takes values from it and calls each callback on each value, in
    order; with no callbacks it creates nothing and `queue` is None;
  - on exit it drains what is still queued (ray_logger.log blocks until its value is queued, so a
    worker's logs all precede its return), stops the thread, kills the queue actor, and then
    re-raises the first exception a callback raised (later values are not passed on after one
    fails), so a broken callback is not silent.
Callbacks run on that one thread, never concurrently with each other.
"""

import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any


class CallbackQueue:
    """One run's callback queue and its consumer thread (module doc)."""

    def __init__(self, callbacks: Sequence[Callable[[Any], Any]] | None) -> None:
        self.callbacks = list(callbacks or [])
        self.queue: Any = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> "CallbackQueue":
        if not self.callbacks:
            return self
        import ray
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self.queue = Queue(
            actor_options={
                "num_cpus": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=True),
            }
        )
        self._thread = threading.Thread(target=self._consume, name="hvdlite-ray-callbacks", daemon=True)
        self._thread.start()
        return self

    def _deliver(self, value: Any) -> None:
        if self._error is not None:
            return
        try:
            for callback in self.callbacks:
                callback(value)
        except BaseException as e:  # kept for __exit__ to re-raise in the caller's thread
            self._error = e

    def _consume(self) -> None:
        from ray.util.queue import Empty

        while not self._done.is_set():
            try:
                self._deliver(self.queue.get(block=True, timeout=0.1))
            except Empty:
                continue
        while True:  # what was queued before the workers returned
            try:
                self._deliver(self.queue.get_nowait())
            except Empty:
                return

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.queue is None:
            return
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.queue.shutdown(force=True)
        failed = self._error
        if exc is None and failed is not None:
            raise failed  # the callback's own exception, as it raised it
