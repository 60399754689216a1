"""One rank of a test function run under a real mpirun (see mpi_helpers.run_mpi_ranks).

    mpirun -n N python tests/mpi_driver.py MODULE FUNCTION ARGS_PICKLE OUT_DIR

Imports FUNCTION from MODULE (a module of tests/), calls it with the pickled args and
writes ("ok", value) or ("error", traceback) to OUT_DIR/rank-R.pkl, R being MPI's rank
from the launcher's environment. Exits 1 when the function raised.
"""

import os
import pickle
import sys
import traceback


def _launcher_rank():
    for key in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(key):
            return int(os.environ[key])
    raise SystemExit("mpi_driver.py must run under mpirun (no OMPI_COMM_WORLD_RANK / PMI_RANK)")


def main(module, function, args_path, out_dir):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    rank = _launcher_rank()
    try:
        with open(args_path, "rb") as f:
            args = pickle.load(f)
        fn = getattr(__import__(module), function)
        result = ("ok", fn(*args))
    except BaseException:
        result = ("error", traceback.format_exc())
    path = os.path.join(out_dir, "rank-%d.pkl" % rank)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)
    if result[0] == "error":
        sys.stderr.write(result[1])
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
