"""Driver side: starts one job of benchmark ranks for a library and collects their results.

    reason = unavailable("horovod")          # None, or why this library cannot run here
    docs, error = run_job("mpi", 4, WORKER, ["--ops", ...], timeout_s=3600, env=None, launcher=None)

Launchers, one per library (each rank runs `script --lib LIB --out DIR ...args`):
  hvdlite  python -m hvdlite.runner.launch -np N (hvdliterun, this interpreter)
  gloo     N processes of this interpreter, torch.distributed init at tcp://127.0.0.1:PORT
  mpi      mpirun -n N (--oversubscribe when N > cores; the root-allow variables as root)
  horovod  .venv-horovod/bin/horovodrun --gloo -np N -H localhost:N (Horovod's own venv)
Every rank gets one compute thread (OMP/MKL/OpenBLAS_NUM_THREADS=1; torch-based adapters also
call torch.set_num_threads(1)).

Shared by the drivers: add_driver_args (--quick, --idle-wait, --out-dir), available (which
libraries run here, printing why the others are skipped) and host_line (the report's first note).

Contract of run_job: returns ([rank doc, ...] read from DIR/rank<r>.json, in rank order, ranks
that wrote nothing left out) and None, or an error string when the job exited non-zero or ran
past timeout_s (then its whole process group is killed). The temporary DIR is always removed.
"""

import datetime
import glob
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HOROVOD_ENV = os.path.join(ROOT, ".venv-horovod")
LIBS = ("hvdlite", "gloo", "mpi", "horovod")
_GRACE_S = 10.0  # after one rank fails, how long the others may take to exit


def unavailable(lib):
    """None when `lib` can run here, else a one-line reason."""
    if lib == "horovod":
        if os.path.exists(os.path.join(HOROVOD_ENV, ".ok")):
            return None
        failed = os.path.join(HOROVOD_ENV, ".failed")
        if os.path.exists(failed):
            with open(failed) as f:
                return "its build failed: " + f.readline().strip()
        return "not built (run `make horovod` or benchmarks/_horovod_env.sh; it takes long)"
    probe = {
        "hvdlite": "import hvdlite._core",
        "gloo": "import torch.distributed as d; assert d.is_gloo_available(), 'no gloo'",
        "mpi": "import mpi4py.MPI",
    }[lib]
    if lib == "mpi" and not shutil.which("mpirun"):
        return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot import it: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return None


def add_driver_args(p, idle_wait=None, quick="a short smoke run"):
    """--quick, --idle-wait (default `idle_wait`; None: the script's own mode decides) and
    --out-dir (default benchmarks/results), the arguments every driver takes."""
    p.add_argument("--quick", action="store_true", help=quick)
    text = "max seconds to wait for an idle machine before timing"
    p.add_argument(
        "--idle-wait",
        type=float,
        default=idle_wait,
        help=text + (" (default %.0f)" % idle_wait if idle_wait else ""),
    )
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))


def available(jobs, lib_of=lambda job: job):
    """(jobs that can run here, {job: why not} for the others), in order; prints each skip.
    Exits when hvdlite itself cannot run: nothing would be measured."""
    ran, skipped = [], {}
    for job in jobs:
        reason = unavailable(lib_of(job))
        if reason and lib_of(job) == "hvdlite":
            sys.exit("hvdlite cannot run here: %s (make install)" % reason)
        if reason:
            skipped[job] = reason
            print("skipping %s: %s" % (job, reason), flush=True)
        else:
            ran.append(job)
    return ran, skipped


def host_line():
    """'- <date>, host H, N CPUs, Python V': the first note of every report."""
    return "- %s, host %s, %d CPUs, Python %s" % (
        datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        platform.node(),
        os.cpu_count() or 1,
        platform.python_version(),
    )


def _env():
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"
    )
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commands(lib, n, rank_cmd, python=None, launch_args=()):
    """[(argv, extra env)] of the processes that start one job of `lib` on n ranks (`python`:
    the ranks' interpreter, default this one; `launch_args`: hvdliterun's extra flags)."""
    py = python or sys.executable
    if lib == "hvdlite":
        return [([py, "-m", "hvdlite.runner.launch", "-np", str(n), *launch_args, py] + rank_cmd, {})]
    if lib == "gloo":
        init = "tcp://127.0.0.1:%d" % _free_port()
        return [
            (
                [py] + rank_cmd,
                {"RANK": str(r), "WORLD_SIZE": str(n), "BENCH_GLOO_INIT": init, "GLOO_SOCKET_IFNAME": "lo"},
            )
            for r in range(n)
        ]
    if lib.startswith("mpi"):
        extra = ["--oversubscribe"] if n > (os.cpu_count() or 1) else []
        return [(["mpirun", "-n", str(n)] + extra + [py] + rank_cmd, {})]
    if lib == "horovod":
        bin_dir = os.path.join(HOROVOD_ENV, "bin")
        return [
            (
                [
                    os.path.join(bin_dir, "horovodrun"),
                    "--gloo",
                    "-np",
                    str(n),
                    "-H",
                    "localhost:%d" % n,
                    os.path.join(bin_dir, "python"),
                ]
                + rank_cmd,
                {},
            )
        ]
    raise ValueError("unknown library %r" % lib)


def _stop(procs):
    """SIGTERM to each live launcher's process group (launchers forward it to their ranks), then
    SIGKILL after _GRACE_S; reaps them all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _GRACE_S
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            time.sleep(0.05)
    for p in procs:
        p.wait()


def _wait(procs, timeout_s):
    """Waits for every process; returns an error string or None. Kills every process group on
    timeout, or _GRACE_S after the first failure (see _stop)."""
    deadline, error = time.monotonic() + timeout_s, None
    while any(p.poll() is None for p in procs):
        failed = [p for p in procs if p.returncode not in (None, 0)]
        if failed and error is None:
            error = "exit code %d" % failed[0].returncode
            deadline = min(deadline, time.monotonic() + _GRACE_S)
        if time.monotonic() > deadline:
            error = error or "timed out after %.0f s" % timeout_s
            break
        time.sleep(0.1)
    _stop(procs)
    bad = [p.returncode for p in procs if p.returncode != 0]
    return error or ("exit code %d" % bad[0] if bad else None)


def run_job(lib, n, script, args, timeout_s, env=None, launcher=None, python=None, launch_args=()):
    """Runs `script` on n ranks of `lib`; see the module contract. `env`: variables set on top
    of the benchmark environment for this job (e.g. PYTHONPATH to another hvdlite tree).
    `launcher`: another library's launcher starts the ranks (e.g. "mpi": hvdlite ranks under
    mpirun, which then form their job through MPI). `python`: the ranks' interpreter (another
    venv's, e.g. TorchRec's), default this one. `launch_args`: extra hvdliterun flags (e.g.
    `-H` of simulated hosts, whose ssh `env` must then find)."""
    out = tempfile.mkdtemp(prefix="hvdlite-bench-")
    try:
        os.mkdir(os.path.join(out, "gate"))
        rank_cmd = [script, "--lib", lib, "--out", out] + list(args)
        base = dict(_env(), **(env or {}))
        procs = [
            subprocess.Popen(argv, env=dict(base, **extra), start_new_session=True)
            for argv, extra in _commands(launcher or lib, n, rank_cmd, python, launch_args)
        ]
        try:
            error = _wait(procs, timeout_s)
        except BaseException:  # Ctrl-C: take the ranks down with us
            _stop(procs)
            raise
        docs = []
        for path in sorted(glob.glob(os.path.join(out, "rank*.json"))):
            with open(path) as f:
                docs.append(json.load(f))
        docs.sort(key=lambda d: d["rank"])
        return docs, error
    finally:
        shutil.rmtree(out, ignore_errors=True)
