"""The remote end of one rank started over ssh: `python -m hvdlite.runner.remote_exec CMD...`.

Contract (hvdlite.runner.remote builds the ssh command that runs this):
  - the first line of stdin carries the rank's secrets: space-separated NAME=VALUE tokens
    (hvdlite.runner.remote.secrets_line: HVDLITE_SECRET, and HVDLITE_ELASTIC_SECRET for an
    elastic worker), a bare token meaning HVDLITE_SECRET; they go into the rank's environment
    only, so they never appear on a command line;
  - CMD runs in its own process group with stdin from /dev/null; its stdout/stderr are ours,
    which ssh carries back to hvdliterun;
  - when stdin reaches EOF (hvdliterun stopped this rank, or the ssh connection is gone) or we
    get SIGTERM/SIGHUP/SIGINT, the whole group gets SIGTERM, then SIGKILL GRACE_S later: no
    process of the rank outlives its ssh session;
  - our exit code is CMD's, or 128 + N when CMD died by signal N.
"""

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 3.0


def _read_line(fd):
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.strip().decode()


class _Watchdog:
    def __init__(self, proc):
        self.proc = proc
        self._lock = threading.Lock()
        self._stopping = False

    def stop(self):
        """SIGTERM to the rank's group, SIGKILL GRACE_S later unless it is gone; idempotent."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self):
        _killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        _killpg(self.proc.pid, signal.SIGKILL)

    def watch_stdin(self):
        """Blocks until stdin reaches EOF (the ssh session is gone), then stops the rank."""
        while True:
            try:
                if not os.read(0, 4096):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        self.stop()


def _killpg(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv):
    if not argv:
        sys.stderr.write("usage: python -m hvdlite.runner.remote_exec COMMAND [ARGS...]\n")
        return 2
    env = dict(os.environ)
    for token in _read_line(0).split():
        name, sep, value = token.partition("=")
        if sep:
            env[name] = value
        else:
            env["HVDLITE_SECRET"] = token
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        sys.stderr.write("hvdliterun: cannot start %r on this host: %s\n" % (argv[0], e))
        return 127
    dog = _Watchdog(proc)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda *_: dog.stop())
    threading.Thread(target=dog.watch_stdin, daemon=True).start()
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    _killpg(proc.pid, signal.SIGKILL)  # whatever the rank left in its group goes with it
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
