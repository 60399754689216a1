"""`hvdliterun --mpi`: the same job, started by Open MPI's (or MPICH's) mpirun.

The ranks then form the job through MPI (hvd.init() sees OMPI_COMM_WORLD_* / PMI_* and
no HVDLITE_RANK): no store is hosted here. Contract of run():
  - runs `mpirun -n N --oversubscribe --bind-to none --tag-output [extra args] COMMAND`
    (Open MPI; as root it also sets OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1). --oversubscribe
    lets N exceed the cores (ranks then yield instead of spinning); --bind-to none leaves
    each rank's background thread free to run on another core;
  - rewrites mpirun's "[job,rank]<stdout>:" tags to hvdliterun's "[rank]<stdout>:", one
    whole line per rank at a time (see _Lines);
  - forwards SIGINT/SIGTERM to mpirun (which stops the ranks) and returns its exit code.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading

_IDENTITY = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "STORE_ADDR", "SECRET")
_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")


def mpirun_command(np, command, mpi_args="", mpirun="mpirun"):
    """The argv that starts `command` on `np` ranks through mpirun."""
    argv = [mpirun, "-n", str(np)]
    if _is_open_mpi(mpirun):
        argv += ["--oversubscribe", "--bind-to", "none", "--tag-output"]
    return argv + shlex.split(mpi_args or "") + list(command)


def mpirun_env(base):
    """`base` plus what mpirun needs: as root, Open MPI refuses to run without these."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    for name in _IDENTITY:  # they would take precedence over MPI's identity in every rank
        for prefix in ("HVDLITE_", "HOROVOD_"):
            env.pop(prefix + name, None)
    return env


def _is_open_mpi(mpirun):
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True  # the launch itself will report what is wrong
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


class _Lines:
    """Rebuilds whole lines per rank from mpirun's tagged stream. mpirun tags every write
    of a rank, so a print() that writes in pieces shows up as segments of several ranks
    interleaved on one physical line ("[1,0]<stdout>:a[1,1]<stdout>:b[1,0]<stdout>:c\n");
    each segment is appended to its rank's pending line, which is emitted, with one
    hvdliterun-style tag, when a newline ends it. Untagged text passes through."""

    def __init__(self, sink):
        self._out = getattr(sink, "buffer", sink)
        self._pending = {}  # (rank, stream) -> bytes of the unfinished line

    def feed(self, line):
        matches = list(_TAG.finditer(line))
        if not matches:
            return self._write(line)
        if matches[0].start() > 0:
            self._write(line[: matches[0].start()] + b"\n")
        for i, m in enumerate(matches):
            key = (m.group(1), m.group(2))
            end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
            text = self._pending.pop(key, b"") + line[m.end() : end]
            if text.endswith(b"\n"):
                self._write(b"[" + key[0] + b"]<" + key[1] + b">:" + text)
            else:
                self._pending[key] = text

    def close(self):
        for (rank, stream), text in sorted(self._pending.items()):
            self._write(b"[" + rank + b"]<" + stream + b">:" + text + b"\n")
        self._pending.clear()

    def _write(self, data):
        try:
            self._out.write(data)
            self._out.flush()
        except (OSError, ValueError):
            pass  # our own output is gone: keep draining mpirun anyway


def _pump(pipe, sink):
    lines = _Lines(sink)
    with pipe:
        for line in iter(pipe.readline, b""):
            lines.feed(line)
    lines.close()


def run(np, command, mpi_args="", verbose=False):
    """Runs the job through mpirun; returns mpirun's exit code (127 when it is missing)."""
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        print("hvdliterun: --mpi needs mpirun on PATH (apt-get install openmpi-bin)", file=sys.stderr)
        return 127
    argv = mpirun_command(np, command, mpi_args, mpirun)
    env = mpirun_env(os.environ)
    if verbose:
        env["HVDLITE_LOG_LEVEL"] = "debug"
        print("hvdliterun: " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr, flush=True)
    proc = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    threads = [
        threading.Thread(target=_pump, args=(p, s), daemon=True)
        for p, s in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
    ]
    for t in threads:
        t.start()
    in_main = threading.current_thread() is threading.main_thread()
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = (
        {s: signal.signal(s, lambda signum, _: proc.send_signal(signum)) for s in handled} if in_main else {}
    )
    try:
        code = proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    for t in threads:
        t.join(2.0)
    return code
