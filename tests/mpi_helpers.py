"""run_ranks' twin that starts the ranks with a real `mpirun` instead of multiprocessing.

    from mpi_helpers import mpi_runner, skip_without_mpi

    values = run_mpi_ranks(fn, 3, args=(...,), env={"HVDLITE_CPU_OPERATIONS": "mpi"})

Contract (the same as helpers.run_ranks, so existing test bodies can run unchanged with
`monkeypatch.setattr(module, "run_ranks", mpi_runner("mpi"))`):
  - fn must be a module-level function of a module in tests/ (the ranks import it by name);
    its args and return value must pickle;
  - the command is hvdliterun --mpi's: `mpirun -n N --oversubscribe --bind-to none ...`
    running tests/mpi_driver.py, with no HVDLITE_RANK/SIZE/STORE_ADDR/SECRET in the
    environment (the job forms through MPI), OMP_NUM_THREADS=1 and the `env` overrides
    (a dict, or rank -> dict called with rank 0: mpirun gives every rank one environment;
    a None value unsets the variable);
  - returns [value per rank]; raises AssertionError with every failed rank's traceback, or
    mpirun's output when it failed without one, or after `timeout` seconds (the whole
    mpirun process group is killed, so nothing outlives the call).
"""

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from hvdlite.runner import mpi_launch

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = shutil.which("mpirun")

skip_without_mpi = pytest.mark.skipif(
    MPIRUN is None or not __import__("hvdlite")._core.build_info()["mpi"],
    reason="needs mpirun and an hvdlite built with MPI (make install installs Open MPI)",
)


def _environment(env):
    out = mpi_launch.mpirun_env(os.environ)
    out.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    out["PYTHONPATH"] = os.pathsep.join([HERE, os.path.dirname(HERE), out.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    extra = env(0) if callable(env) else env
    for key, value in (extra or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = str(value)
    return out


def _kill_group(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_mpi_ranks(fn, size, args=(), timeout=60.0, env=None):
    with tempfile.TemporaryDirectory(prefix="hvdlite-mpi-") as out_dir:
        args_path = os.path.join(out_dir, "args.pkl")
        with open(args_path, "wb") as f:
            pickle.dump(tuple(args), f)
        command = [
            sys.executable,
            os.path.join(HERE, "mpi_driver.py"),
            fn.__module__,
            fn.__name__,
            args_path,
            out_dir,
        ]
        argv = mpi_launch.mpirun_command(size, command, mpirun=MPIRUN)
        proc = subprocess.Popen(
            argv,
            env=_environment(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            output, _ = proc.communicate()
            timed_out = True
        results = {}
        for rank in range(size):
            path = os.path.join(out_dir, "rank-%d.pkl" % rank)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    results[rank] = pickle.load(f)
    return _judge(fn, size, timeout, proc.returncode, timed_out, output.decode(errors="replace"), results)


def _judge(fn, size, timeout, code, timed_out, output, results):
    failed = [r for r in range(size) if results.get(r, ("missing",))[0] != "ok"]
    if not failed and code == 0 and not timed_out:
        return [results[r][1] for r in range(size)]
    what = "timed out after %.0f s" % timeout if timed_out else "mpirun exited with code %s" % code
    lines = ["%s on %d MPI ranks failed: %s" % (fn.__name__, size, what)]
    for r in failed:
        kind, payload = results.get(r, ("missing", None))
        lines.append("--- rank %d: %s ---" % (r, payload.rstrip() if kind == "error" else "no result"))
    lines.append("--- mpirun output (last 4000 chars) ---\n" + output[-4000:])
    raise AssertionError("\n".join(lines))


def mpi_runner(cpu_operations):
    """A run_ranks replacement running under mpirun with HVDLITE_CPU_OPERATIONS set."""

    def run(fn, size, args=(), timeout=60.0, env=None):
        extra = dict(env(0) if callable(env) else (env or {}))
        extra["HVDLITE_CPU_OPERATIONS"] = cpu_operations
        return run_mpi_ranks(fn, size, args=args, timeout=timeout, env=extra)

    return run
