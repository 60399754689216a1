"""hvdlite.elastic: Horovod's elastic training API, framework-neutral (horovod.common.elastic)::

    import hvdlite as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(epoch=0, step=0, weights=w)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            state.weights -= lr * hvd.allreduce(grad(state.weights))
            state.step += 1
            state.commit()

    train(state)

Launch with ``hvdliterun -np 4 --min-np 2 --host-discovery-script S python train.py`` (or -H
with --min-np). When a worker dies, the survivors' collective in flight raises
HorovodInternalError; run() restores the last commit, re-forms the job with the driver's next
generation, syncs state from the new rank 0 and calls the function again. Hosts added or removed
raise HostsUpdatedInterrupt at the same commit() on every rank.
"""

from hvdlite.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from hvdlite.elastic.state import ObjectState, State, run, run_fn

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "run", "run_fn"]
