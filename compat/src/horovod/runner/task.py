"""One rank of horovod.run(): `python -m horovod.runner.task DIR` loads (func, args, kwargs) from
DIR/func.pkl, calls it, and writes the return value to DIR/result.<rank>.pkl (rank from the
launcher's HVDLITE_RANK, or 0). An exception propagates: the rank exits non-zero with its
traceback, and hvdliterun stops the job."""

import os
import pickle
import sys

from horovod.runner import pickler


def main(directory: str) -> None:
    with open(os.path.join(directory, "func.pkl"), "rb") as f:
        func, args, kwargs = pickle.load(f)  # cloudpickle's output loads with plain pickle
    result = func(*args, **kwargs)
    rank = int(os.environ.get("HVDLITE_RANK", "0"))
    path = os.path.join(directory, "result.%d.pkl" % rank)
    with open(path + ".tmp", "wb") as f:
        pickler().dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(sys.argv[1])
