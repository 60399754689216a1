"""broadcast_object / allgather_object: any picklable Python object, sent as
pickled bytes in uint8 arrays over the public collectives. Framework adapters
re-export these unchanged (the bytes never touch a framework tensor).

cloudpickle is used when it is installed (it also pickles lambdas and local
classes, as Horovod's does); otherwise the standard pickle.
"""

import pickle

import numpy as np

from hvdlite.common import collectives, naming, ops
from hvdlite.common.numpy_buffers import NUMPY
from hvdlite.common.process_sets import global_process_set, resolve
from hvdlite.common.topology import rank

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def _dumps(obj):
    return np.frombuffer(_pickler.dumps(obj), dtype=np.uint8).copy()


def _loads(array):
    return pickle.loads(array.tobytes())


def _run(pending):
    return ops.synchronize(collectives.start(pending))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` on every member of `process_set` (root_rank is
    a global rank). Two broadcasts: the pickled length, then the bytes.
    Unnamed calls are numbered in call order (Horovod names them after
    type(obj), which deadlocks when non-roots pass a placeholder of another type)."""
    name = naming.auto_name("broadcast_object", name)  # not type(obj): non-roots often pass None
    set_id = resolve(process_set)
    is_root = rank() == root_rank
    payload = _dumps(obj) if is_root else None
    length = np.array([0 if payload is None else payload.size], dtype=np.int64)
    _run(
        collectives.inplace(
            NUMPY, "broadcast", ops.BROADCAST, length, name + ".sz", root=root_rank, process_set=set_id
        )
    )
    if not is_root:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    _run(
        collectives.inplace(
            NUMPY, "broadcast", ops.BROADCAST, payload, name + ".t", root=root_rank, process_set=set_id
        )
    )
    return obj if is_root else _loads(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every member's `obj`, in rank order within `process_set`."""
    name = naming.auto_name("allgather_object", name)
    set_id = resolve(process_set)
    payload = _dumps(obj)
    sizes, _ = _run(
        collectives.with_output(
            NUMPY,
            "allgather",
            ops.ALLGATHER,
            np.array([payload.size], dtype=np.int64),
            name + ".sz",
            process_set=set_id,
        )
    )
    gathered, _ = _run(
        collectives.with_output(NUMPY, "allgather", ops.ALLGATHER, payload, name + ".t", process_set=set_id)
    )
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [_loads(gathered[offsets[i] : offsets[i + 1]]) for i in range(len(sizes))]
