"""The Work objects the hvdlite process group returns, and the thread that completes futures.

Contract:
- A ``HvdliteWork`` owns the core handles of one torch call (the Pending records of
  ``hvdlite.common.collectives``) and a ``finish`` that copies results where torch expects them
  and returns the output tensors. Completion happens exactly once, under the work's lock, on
  whichever thread gets there first: a caller of ``wait()``, or the completer thread once
  ``get_future()`` was asked for. Other threads block on the lock meanwhile.
- Every wait is bounded: the core fails an operation whose peer died, froze or went silent
  within its liveness bound, and ``wait(timeout)`` raises ``HvdliteTimeoutError`` once its own
  timeout passes (the operation keeps running; the work may be waited for again).
- A failed operation raises its hvdlite error (a RuntimeError, as torch's DistBackendError is)
  from ``wait()``, is reported by ``exception()``, and fails the future.
- ``DoneWork`` is what a call that already completed returns (a blocking all_reduce): no lock,
  no handle, a few hundred nanoseconds.
"""

import queue
import threading
import time

import torch
import torch.distributed as dist

from hvdlite.common import exceptions, ops


def _timeout_message(seconds):
    return (
        "torch.distributed work on the hvdlite backend did not complete within %.3f s "
        "(Work.wait timeout, or the group's); it is still running and may be waited for again" % seconds
    )


def _seconds(timeout):
    """Work.wait's timeout (a timedelta; torch passes 0 for none) in seconds; 0: none."""
    return timeout.total_seconds() if timeout is not None else 0.0


class HvdliteWork(dist.Work):
    """One torch call in flight on hvdlite's core. ``pendings``: the Pending records of its core
    operations; ``finish()``: runs after all completed and returns the output tensors (what
    ``result()`` and the future hold)."""

    def __init__(self, pendings, finish):
        super().__init__()
        self._pendings = pendings
        self._finish = finish
        self._lock = threading.Lock()
        self._done = False
        self._error = None
        self._outputs = None
        self._future = None
        self._waited: set[int] = set()  # indexes of the pendings whose core operation completed
        self.default_timeout_s = 0.0  # the group's timeout, for wait() without one (0: none)
        # (forget(work), set by the group that tracks this work's names): called once completed,
        # so the group drops its reference and this work's tensors are not kept alive.
        self.on_done = None

    def _core_done(self):
        return all(ops.poll_core(p.core) for p in self._pendings)

    def is_done(self):
        """Whether completion (finish included) has run."""
        return self._done

    def _complete(self, deadline=None):
        """Waits for the core operations (until `deadline`, a time.monotonic() value, when
        given) and runs finish once. Returns False when the deadline passed first."""
        if self._done:
            return True
        if deadline is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            if self.is_done():  # completed by another thread while this one waited for the lock
                return True
            if not self._wait_core(deadline):
                return False
            self._run_finish()
        finally:
            self._lock.release()
        if self._future is not None:
            _settle(self._future, self._outputs, self._error)
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done(self)
        return True

    def _wait_core(self, deadline):
        """Waits for every core operation, even after one failed (the core may still use the
        others' buffers); the first failure becomes the work's error. False: the deadline
        passed first (the operations still run; a later call waits for the rest)."""
        for i, p in enumerate(self._pendings):
            if i in self._waited:
                continue
            try:
                if not ops.wait(p.core, deadline):
                    return False
            except exceptions.HvdliteError as e:  # ops.wait released the failed handle
                self._error = self._error or e
            self._waited.add(i)
        return True

    def _run_finish(self):
        finish, self._finish = self._finish, None  # its closure holds the call's tensors
        try:
            if self._error is None:
                self._outputs = finish()
            else:
                for p in self._pendings:  # all done now: free what the others produced
                    ops.release(p.core)
        except exceptions.HvdliteError as e:
            self._error = e
        self._pendings = ()
        self._done = True

    # ---- torch's Work API ----

    def wait(self, timeout=None):
        """Blocks until done (at most `timeout`, a timedelta; None or 0: the group's timeout from
        init_process_group / new_group; the core's bounds always apply) and raises the
        operation's error; returns True."""
        seconds = _seconds(timeout) or self.default_timeout_s
        if not self._complete(time.monotonic() + seconds if seconds > 0 else None):
            raise exceptions.HvdliteTimeoutError(_timeout_message(seconds))
        error = self._error
        if error is not None:
            raise error
        return True

    def is_completed(self):
        return self._done or self._core_done()

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._outputs

    def synchronize(self):
        self.wait()

    def get_future(self):
        """A torch Future that holds the output tensors once the work completes; completed
        by the completer thread, so nobody has to call wait()."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    _settle(self._future, self._outputs, self._error)
                else:
                    _completer().put(self)
        return self._future


class DoneWork(dist.Work):
    """The work of a call that completed before returning."""

    def __init__(self, outputs):
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._outputs

    def synchronize(self):
        pass

    def get_future(self):
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result(self._outputs)
        return future


def _settle(future, outputs, error):
    """Completes `future` with the outputs or the error (once)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outputs)


class _Completer:
    """One daemon thread per process that completes the works whose futures were asked for,
    in submission order (the core runs a group's operations in that order too). It blocks in
    the core's wait with the GIL released; it never spins."""

    def __init__(self):
        self._queue: queue.SimpleQueue[HvdliteWork] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="hvdlite-torch-futures", daemon=True)
        self._thread.start()

    def put(self, work):
        self._queue.put(work)

    def _run(self):
        while True:
            work = self._queue.get()
            try:
                work._complete()
            except BaseException as e:  # never let the thread die: fail the future instead
                if work._future is not None and not work._future.done():
                    work._future.set_exception(e)


_the_completer = None
_completer_lock = threading.Lock()


def _completer():
    global _the_completer
    if _the_completer is None:
        with _completer_lock:
            if _the_completer is None:
                _the_completer = _Completer()
    return _the_completer
