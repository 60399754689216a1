"""State, ObjectState and the run wrapper: Horovod's elastic semantics (horovod.common.elastic).

- commit() = save() + check_host_updates(); check_host_updates() raises HostsUpdatedInterrupt
  at the same commit() on every rank: rank 0 asks the elastic driver whether a newer
  generation of the job exists and broadcasts the answer.
- run(func)(state, ...): sync state from rank 0, call func; on HorovodInternalError restore the
  last commit, re-form the job (shutdown(), join the driver's next generation, init()), sync
  and call func again; on HostsUpdatedInterrupt re-form without restoring (and without
  syncing when workers were only removed: the survivors' states are equal already).
"""

import copy
import functools
import queue

from hvdlite.common import objects, topology
from hvdlite.common.exceptions import HostsUpdatedInterrupt, HvdliteInternalError, NotSupportedError
from hvdlite.elastic import worker


class HostMessages(queue.Queue[tuple[float, int]]):
    """Horovod's State._host_messages: the host updates the elastic driver announced and the
    state has not acted on yet, as (timestamp, generation) items. Horovod's driver pushes them
    to each worker; here the queue pulls the generations published since the last one it saw
    from the driver's store whenever it is asked (empty(), qsize(), get()), so no thread
    watches the store. Outside an elastic job it is an ordinary, empty queue."""

    def __init__(self):
        super().__init__()
        self._seen = 0  # the newest generation already queued

    def _pull(self):
        ctx = worker.context()
        if ctx is None:
            return
        ctx.current()  # sets ctx.generation, this process's
        for gen, timestamp in ctx.generations_after(max(self._seen, ctx.generation)):
            self.put((timestamp, gen))
            self._seen = gen

    def empty(self):
        self._pull()
        return super().empty()

    def qsize(self):
        self._pull()
        return super().qsize()

    def get(self, block=True, timeout=None):
        self._pull()
        return super().get(block, timeout)


class State:
    """In-memory training state kept consistent across workers.

    bcast_object(obj) returns rank 0's obj on every rank; get_rank() is this process's rank.
    _host_messages and _last_updated_timestamp are Horovod's (its elastic test scripts wait on
    the first and reset the second): the pending host updates, and the timestamp of the last
    one check_host_updates() acted on.
    """

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or objects.broadcast_object
        self._rank = get_rank or topology.rank
        self._known_generation = 0
        self._reset_callbacks = []
        self._host_messages = HostMessages()
        self._last_updated_timestamp = 0.0

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every reset, once the job has re-formed: e.g. to
        scale the learning rate with the new hvd.size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state in host memory (the point a failure rolls back to), then checks for
        host updates (raises HostsUpdatedInterrupt on every rank alike)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when the elastic driver has published a newer generation
        of the job (hosts added or removed). A collective: call it on every rank."""
        ctx = worker.context()
        news = None
        if ctx is not None and self._rank() == 0:
            news = ctx.newer_generation()
            while not self._host_messages.empty():  # what `news` acts on (rank 0 asks the driver)
                timestamp, _ = self._host_messages.get_nowait()
                self._last_updated_timestamp = max(self._last_updated_timestamp, timestamp)
        news = self._bcast_object(news)
        if news is not None:
            _, added = news
            raise HostsUpdatedInterrupt(skip_sync=not added)

    def save(self):
        """Saves the state to host memory."""
        raise NotSupportedError("%s must define this method" % type(self).__name__)

    def restore(self):
        """Restores the last committed state, undoing uncommitted modifications."""
        raise NotSupportedError("%s must define this method" % type(self).__name__)

    def sync(self):
        """Makes every rank's state rank 0's."""
        raise NotSupportedError("%s must define this method" % type(self).__name__)

    def reset(self):
        """Called after a reset, before the reset callbacks and the sync."""


class ObjectState(State):
    """State of plain (picklable) Python objects, given as keyword arguments and exposed as
    attributes: ``state = ObjectState(epoch=0, batch=0)``; ``state.epoch += 1``.

    bcast_object / get_rank default to hvdlite's broadcast_object and rank (NumPy API), so it
    serves framework-agnostic scripts as it is; Horovod passes them positionally."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


def _reset(error):
    ctx = worker.context()
    if ctx is None:
        raise error  # not started by an elastic driver: nobody can re-form the job
    ctx.reset(error)


def run_fn(func, reset=_reset):
    """The run decorator over `reset(error)`, which must re-form the job or raise."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        reset_pending = False
        error: Exception
        while True:
            try:
                if reset_pending:
                    # Inside the try: on_reset may run collectives (TorchState rebuilding ZeRO
                    # shards), and a rank lost meanwhile is recovered from like any other.
                    reset_pending = False
                    state.on_reset()
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HvdliteInternalError as e:
                state.restore()
                skip_sync = False
                error = e
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
                error = e
            reset(error)
            reset_pending = True

    return wrapper


def run(func):
    """Decorator running ``func(state, *args, **kwargs)`` elastically (Horovod's hvd.elastic.run).
    Collectives must not run before the call: new workers sync state in it."""
    return run_fn(func)
