"""One rank of hvdlite.spark.run(): `python -m hvdlite.spark.task DIR` loads (fn, args, kwargs)
from DIR/fn.pkl, calls it and writes its pickled return value to DIR/result.pkl. The Spark task
that started it set the job description in its environment; an exception propagates (the rank
exits non-zero with its traceback on stderr, which the task reports)."""

import os
import pickle
import sys


def main(directory: str) -> None:
    with open(os.path.join(directory, "fn.pkl"), "rb") as f:
        fn, args, kwargs = pickle.load(f)  # cloudpickle's output loads with plain pickle
    result = fn(*args, **kwargs)
    from hvdlite.spark import _pickler

    with open(os.path.join(directory, "result.pkl"), "wb") as f:
        _pickler().dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
