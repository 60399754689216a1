"""The N local processes of one job: spawn them, prefix their output, stop them all on failure.

Contract of LocalJob.run():
  - every rank runs `command` in its own process group with its own environment;
  - each output line of rank r is forwarded as b"[r]<stdout>:" + line to our stdout (stderr
    likewise), one reader thread per pipe, whole lines never interleaved; '\r' progress bars
    are drawn live on a terminal and collapsed on a pipe (output.py);
  - the first rank to exit non-zero is reported on our stderr and every other rank gets
    SIGTERM, then SIGKILL TERM_GRACE_S later; SIGINT/SIGTERM sent to us are forwarded the
    same way (a second one kills at once);
  - returns 0 when every rank exits 0; the failed rank's exit code (1 when it died by a
    signal) after a failure; 128 + signum when we were interrupted.
  Nothing waits unboundedly once the job is stopping: after SIGKILL we wait KILL_WAIT_S more.
"""

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from hvdlite.runner.output import Console

TERM_GRACE_S = 5.0  # SIGTERM -> SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL, how long we still wait for the processes to be reaped
READER_JOIN_S = 2.0  # after the processes are gone, how long we wait for their output to drain
_TICK_S = 0.5  # the monitor wakes this often while waiting (no busy loop)


class _TeePipe:
    """A child's pipe whose every chunk read is also written, unprefixed, to the file `path`
    (--output-filename). Used from one reader thread only; closing it closes both."""

    def __init__(self, pipe, path):
        self._pipe = pipe
        self._copy = open(path, "wb")  # noqa: SIM115 -- closed in __exit__

    def read1(self, size):
        data = self._pipe.read1(size) if hasattr(self._pipe, "read1") else self._pipe.read(size)
        if data:
            self._copy.write(data)
            self._copy.flush()
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self._pipe.close()
        finally:
            self._copy.close()


def _pump(pipe, prefix, sink, path=None):
    """Copies `pipe` to `sink` (an output.Console stream), each line prefixed, and unprefixed
    to the file `path` when given; returns at EOF."""
    sink.source(prefix).pump(_TeePipe(pipe, path) if path else pipe)


def describe_exit(code):
    """'exited with code 3' / 'was killed by signal 9 (SIGKILL)' for a Popen returncode."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return "was killed by signal %d (%s)" % (-code, name)
    return "exited with code %s" % code


def describe_remote_exit(code):
    """describe_exit for a rank started over ssh: 255 is ssh's own failure, 128 + N a signal
    that killed the rank on its host (remote_exec.py reports it so)."""
    if code == 255:
        return "lost its ssh connection (exit code 255: host down, unreachable or sshd gone?)"
    if code is not None and 128 < code < 128 + 65:
        return describe_exit(128 - code) + " on its host"
    return describe_exit(code)


def start_rank(argv, env, stdin_data=None):
    """Starts one rank's process (argv/env/stdin_data from remote.rank_launch) in its own process
    group, stdout and stderr piped. stdin_data is written to its stdin, which then stays open
    (owned by the returned Popen) until the caller closes it or the process ends; None: stdin is
    /dev/null. Raises OSError when argv[0] cannot be started."""
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    if stdin_data is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin_data)
            proc.stdin.flush()
        except OSError:
            pass  # it died already: whoever waits for it sees its exit
    return proc


class LocalJob:
    def __init__(self, command, envs, log=None, argvs=None, stdin_data=None, output_dir=None, hosts=None):
        """command: argv list; envs: one environment dict per rank; log: callable(str) for our
        own messages (default: stderr). argvs: per rank, the argv actually started (default:
        `command`; ssh for a remote rank). stdin_data: per rank, bytes written to its stdin,
        which then stays open until the job ends (a remote rank's secret; its EOF tells the
        remote end to stop), or None for /dev/null. output_dir: each rank's output is also
        written to output_dir/rank.<r>/stdout and .../stderr (Horovod's --output-filename).
        hosts: per rank, (host name, started over ssh) for our messages, or None."""
        self.command = list(command)
        self.envs = list(envs)
        self.argvs = list(argvs) if argvs is not None else [self.command] * len(self.envs)
        self.stdin_data = list(stdin_data) if stdin_data is not None else [None] * len(self.envs)
        self.output_dir = output_dir
        self.hosts = list(hosts) if hosts is not None else [None] * len(self.envs)
        console = Console(sys.stdout, sys.stderr)
        self._out, self._err = console.stdout, console.stderr
        self._log = log or (lambda msg: self._err.write(("hvdliterun: %s\n" % msg).encode()))
        self._procs = []
        self._threads = []
        self._exits: queue.Queue[tuple[int, int]] = (
            queue.Queue()
        )  # (rank, returncode) as each process is reaped
        self._stop_deadline = None  # when set: SIGKILL everyone still running at this time
        self._killed = False
        self._signal = None  # signum we were interrupted by, if any
        self._notes = []  # messages queued by the signal handler

    # -- starting -----------------------------------------------------------------------------
    def _start(self):
        width = len(str(len(self.envs) - 1))
        for rank, env in enumerate(self.envs):
            proc = start_rank(self.argvs[rank], env, self.stdin_data[rank])
            self._procs.append(proc)
            rank_dir = None
            if self.output_dir:
                rank_dir = os.path.join(self.output_dir, "rank.%0*d" % (width, rank))
                os.makedirs(rank_dir, exist_ok=True)
            for pipe, name, sink in ((proc.stdout, "stdout", self._out), (proc.stderr, "stderr", self._err)):
                prefix = ("[%d]<%s>:" % (rank, name)).encode()
                path = os.path.join(rank_dir, name) if rank_dir else None
                self._spawn_thread(_pump, pipe, prefix, sink, path)
            self._spawn_thread(self._reap, rank, proc)

    def _spawn_thread(self, target, *args):
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _reap(self, rank, proc):
        self._exits.put((rank, proc.wait()))

    # -- stopping -----------------------------------------------------------------------------
    def _signal_all(self, signum):
        """Sends signum to every rank's process group (its children included)."""
        for proc in self._procs:
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass  # already gone

    def _begin_stop(self, signum=signal.SIGTERM):
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + TERM_GRACE_S
        self._signal_all(signum)

    def _kill_all(self):
        self._killed = True
        self._stop_deadline = time.monotonic() + KILL_WAIT_S
        self._signal_all(signal.SIGKILL)

    def _on_signal(self, signum, frame):
        # Runs in the main thread between bytecodes: no logging here (the main thread may be
        # inside a write); the monitor loop prints self._notes at its next tick.
        name = signal.Signals(signum).name
        if self._signal is not None or self._stop_deadline is not None:
            self._signal = self._signal or signum
            self._notes.append("got %s again: killing every rank" % name)
            self._kill_all()
            return
        self._signal = signum
        self._notes.append("got %s: forwarding it to every rank" % name)
        self._begin_stop(signum)

    # -- running ------------------------------------------------------------------------------
    def run(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        in_main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._on_signal) for s in handled} if in_main else {}
        try:
            try:
                self._start()
            except OSError as e:
                self._log("cannot start %r: %s" % (self.command[0], e))
                self._begin_stop()
                self._wait_all(set(range(len(self._procs))))
                return 127
            failure = self._wait_all(set(range(len(self._procs))))
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self._close_stdins()
        self._join_readers()
        if failure is not None:
            code = failure[1]
            return code if 0 < code < 256 else 1
        if self._signal is not None:
            return 128 + self._signal
        return 0

    def _wait_all(self, running):
        """Waits until every rank in `running` is reaped (or the kill deadline passes);
        returns (rank, code) of the first failure, or None."""
        failure = None
        while running:
            while self._notes:
                self._log(self._notes.pop(0))
            try:
                rank, code = self._exits.get(timeout=_TICK_S)
            except queue.Empty:
                if self._stop_deadline is not None and time.monotonic() >= self._stop_deadline:
                    if self._killed:
                        self._log("ranks %s did not exit after SIGKILL; giving up on them" % sorted(running))
                        return failure
                    self._log(
                        "ranks %s still running %.0f s after SIGTERM: sending SIGKILL"
                        % (sorted(running), TERM_GRACE_S)
                    )
                    self._kill_all()
                continue
            running.discard(rank)
            if code != 0 and failure is None and self._stop_deadline is None:
                failure = (rank, code)
                others = len(running)
                self._log("%s; stopping the other %d rank(s)" % (self._describe(rank, code), others))
                self._begin_stop()
        return failure

    def _describe(self, rank, code):
        host = self.hosts[rank]
        if host is None:
            return "rank %d %s" % (rank, describe_exit(code))
        name, over_ssh = host
        how = describe_remote_exit(code) if over_ssh else describe_exit(code)
        return "rank %d (host %s) %s" % (rank, name, how)

    def _close_stdins(self):
        for proc in self._procs:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass

    def _join_readers(self):
        deadline = time.monotonic() + READER_JOIN_S
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
