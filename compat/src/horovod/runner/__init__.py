"""horovod.runner: `horovodrun` (launch.py, Horovod's flags over hvdliterun) and run(), Horovod's
programmatic launcher, over the same command line."""

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any


def pickler() -> Any:
    """cloudpickle where installed (it pickles functions defined in __main__, closures and lambdas
    by value, as Horovod does), else pickle (module-level functions only)."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    np: int = 1,
    hosts: str | None = None,
    hostfile: str | None = None,
    start_timeout: int | None = None,
    disable_cache: bool | None = None,
    verbose: bool | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    executable: str | None = None,
    **unused: Any,
) -> list[Any]:
    """Horovod's horovod.run(): runs func(*args, **kwargs) on `np` ranks started by horovodrun
    (in a child process) and returns the ranks' return values, in rank order. Blocks until the
    job ends; raises RuntimeError naming the exit code when a rank fails (its traceback is on
    stderr). Elastic (min_np, max_np, ...) and ssh arguments are Horovod's and have no effect
    here; so do output_filename and network_interface."""
    cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", str(np)]
    if hosts:
        cmd += ["-H", hosts]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    if start_timeout is not None:
        cmd += ["--start-timeout", str(start_timeout)]
    if disable_cache:
        cmd.append("--disable-cache")
    if verbose:
        cmd.append("--verbose")
    if use_gloo:
        cmd.append("--gloo")
    if use_mpi:
        cmd.append("--mpi")
    if mpi_args:
        cmd += ["--mpi-args", mpi_args]
    with tempfile.TemporaryDirectory(prefix="horovod-run-") as d:
        with open(os.path.join(d, "func.pkl"), "wb") as f:
            pickler().dump((func, tuple(args), dict(kwargs or {})), f)
        cmd += [executable or sys.executable, "-m", "horovod.runner.task", d]
        code = subprocess.run(cmd).returncode
        if code != 0:
            raise RuntimeError(
                "horovod.run: the job failed with exit code %d (see the ranks' output above)" % code
            )
        results = []
        for rank in range(np):
            with open(os.path.join(d, "result.%d.pkl" % rank), "rb") as f:
                results.append(pickle.load(f))
        return results
