"""`hvdliterun --mpi`: the same job, started by Open MPI's (or MPICH's) mpirun.

The ranks then form the job through MPI (hvd.init() sees OMPI_COMM_WORLD_* / PMI_* and
no HVDLITE_RANK): no store is hosted here. Contract of run():
  - runs `mpirun -n N --oversubscribe --bind-to none --tag-output [extra args] COMMAND`
    (Open MPI; as root it also sets OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1). --oversubscribe
    lets N exceed the cores (ranks then yield instead of spinning); --bind-to none leaves
    each rank's background thread free to run on another core;
  - forwards each rank's output as hvdliterun does without --mpi: mpirun's "[job,rank]<stdout>:"
    tags are split into per-rank streams (_Demux) that output.py renders, so lines are
    prefixed "[rank]<stdout>:" and never interleaved, and '\\r' progress bars are drawn live
    on a terminal and collapsed to whole lines on a pipe;
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

from hvdlite.common import job as jobs
from hvdlite.runner.output import Console

_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")
_PARTIAL_TAG = re.compile(rb"\[\d*(?:,\d*(?:\](?:<[a-z]{0,7}>?)?)?)?\Z")  # a tag cut by a read
_READ_BYTES = 65536


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
    return jobs.clear(env)  # they would take precedence over MPI's identity in every rank


def _is_open_mpi(mpirun):
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True  # the launch itself will report what is wrong
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


class _Demux:
    """Splits one of mpirun's tagged pipes into per-rank sources of output.py, which render
    them exactly as hvdliterun renders its own ranks ('\\r' progress bars included).

    Open MPI's --tag-output puts "[job,rank]<stdout>:" before every piece it read from a rank
    and after every '\\n' inside one, so the text between two tags belongs to the first tag's
    rank, even when a piece is a bar state without a newline or several ranks' pieces share a
    physical line ("[1,0]<stdout>:a[1,1]<stdout>:b[1,0]<stdout>:c\\n"). Text that follows a
    completed line without a tag is mpirun's own and passes through unprefixed (text that
    follows an unfinished rank line is taken as that rank's continuation). A tag cut by a
    read is held back until the next read. Used by one reader thread only."""

    def __init__(self, stream):
        self._stream = stream  # an output.Console stream
        self._sources = {}  # (rank, name) -> output.Source
        self._own = stream.source(b"")  # mpirun's own messages
        self._current = self._own
        self._held = b""  # the start of a tag cut off at the end of the last read

    def pump(self, pipe):
        """Copies the binary pipe `pipe` until EOF, then closes it."""
        with pipe:
            while True:
                data = pipe.read1(_READ_BYTES)
                if not data:
                    break
                self.feed(data)
        self.feed(b"", final=True)

    def feed(self, data, final=False):
        data, self._held = self._held + data, b""
        cut = data.rfind(b"[")
        if not final and cut >= 0 and _PARTIAL_TAG.match(data, cut):
            data, self._held = data[:cut], data[cut:]
        pos = 0
        for m in _TAG.finditer(data):
            self._text(data[pos : m.start()])
            self._current = self._source(m.group(1), m.group(2))
            pos = m.end()
        self._text(data[pos:])
        if final:
            for src in [self._own, *self._sources.values()]:
                src.feed(b"", final=True)

    def _text(self, text):
        if text:
            self._current.feed(text)
            if text.endswith(b"\n"):
                self._current = self._own

    def _source(self, rank, name):
        key = (rank, name)
        if key not in self._sources:
            self._sources[key] = self._stream.source(b"[" + rank + b"]<" + name + b">:")
        return self._sources[key]


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
    console = Console(sys.stdout, sys.stderr)
    threads = [
        threading.Thread(target=_Demux(s).pump, args=(p,), daemon=True)
        for p, s in ((proc.stdout, console.stdout), (proc.stderr, console.stderr))
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
