"""Starting ranks on other hosts over plain ssh, and checking those hosts first.

Contract:
  - ssh always runs with BatchMode (never a password prompt), without a tty, with keepalives
    (a host that vanishes ends the ssh process within ~ALIVE_INTERVAL_S * ALIVE_COUNT s);
  - a rank's environment travels on the remote command line as `env K=V ...` (visible to
    that host's users like any command line, so the job secret is NOT in it: it goes on ssh's
    stdin, see remote_exec.py), and the remote command runs in the launcher's working directory;
  - check_hosts() contacts every host in parallel and returns within connect_timeout + a few
    seconds, naming each host it could not run `true` on, with ssh's own reason.
"""

import os
import re
import shlex
import subprocess
import sys
import threading

ALIVE_INTERVAL_S = 1
ALIVE_COUNT = 3
CHECK_SLACK_S = 5.0

# Variables that describe the launching session, not the job: each host has its own.
_NOT_FORWARDED = {
    "HOSTNAME",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "TERM",
    "DISPLAY",
    "MAIL",
    "LS_COLORS",
    "TMUX",
    "_",
    "HVDLITE_SECRET",
    "HVDLITE_ELASTIC_SECRET",
    "HOROVOD_SECRET",
}
# The variables that go to a remote rank on ssh's stdin (remote_exec.py), never on a command line.
SECRET_VARS = ("HVDLITE_SECRET", "HVDLITE_ELASTIC_SECRET")
_NOT_FORWARDED_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_", "PYTEST_", "COLUMNS", "LINES")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SshOptions:
    def __init__(self, port=None, identity_file=None, connect_timeout=10.0):
        self.port = port
        self.identity_file = identity_file
        self.connect_timeout = connect_timeout

    def argv(self, host):
        """ssh ... host (the remote command follows)."""
        out = [
            "ssh",
            "-T",
            "-x",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",  # a new host is learnt; a changed key still fails
            "-o",
            "LogLevel=ERROR",  # no "Permanently added ..." line in every rank's stderr
            "-o",
            "ConnectTimeout=%d" % max(1, int(self.connect_timeout)),
            "-o",
            "ServerAliveInterval=%d" % ALIVE_INTERVAL_S,
            "-o",
            "ServerAliveCountMax=%d" % ALIVE_COUNT,
        ]
        if self.port:
            out += ["-p", str(self.port)]
        if self.identity_file:
            out += ["-i", self.identity_file]
        return out + [host]


def forwarded_env(env):
    """The part of `env` a remote rank gets: everything but session variables and the secret."""
    return {
        k: v
        for k, v in env.items()
        if _NAME.match(k) and k not in _NOT_FORWARDED and not k.startswith(_NOT_FORWARDED_PREFIXES)
    }


def remote_command(command, env, cwd=None):
    """The shell command line the remote host runs for one rank (the secret is not in it)."""
    cwd = os.getcwd() if cwd is None else cwd
    assigns = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(forwarded_env(env).items()))
    argv = [sys.executable, "-m", "hvdlite.runner.remote_exec", *command]
    return "cd %s >/dev/null 2>&1; exec env %s %s" % (
        shlex.quote(cwd),
        assigns,
        " ".join(shlex.quote(a) for a in argv),
    )


def rank_argv(host, command, env, options):
    """The local argv that starts one rank on `host`; write secrets_line(env) to its stdin."""
    return options.argv(host) + [remote_command(command, env)]


def secrets_line(env):
    """The first stdin line of a remote rank: its SECRET_VARS as NAME=VALUE tokens."""
    return (" ".join("%s=%s" % (k, env[k]) for k in SECRET_VARS if env.get(k)) + "\n").encode()


def rank_launch(host, command, env, options, local, client_env=None):
    """How to start one rank of `command` with environment `env` on `host`, for every launcher
    (multihost.py, elastic_driver.py): (argv, environment of the local process, stdin bytes or
    None), to give to job.start_rank(). A local rank runs `command` directly with `env`; a remote
    one runs ssh (environment: `client_env`, default ours) whose stdin gets the secrets and must
    stay open while the rank runs: closing it, or killing the ssh process, stops the rank's whole
    process group on its host (remote_exec.py)."""
    if local:
        return list(command), env, None
    ssh_env = dict(os.environ if client_env is None else client_env)
    return rank_argv(host, command, env, options), ssh_env, secrets_line(env)


def check_hosts(hosts, options):
    """{host: reason} for every host ssh cannot run `true` on; empty when all are reachable."""
    failures = {}
    lock = threading.Lock()

    def probe(host):
        try:
            proc = subprocess.run(
                options.argv(host) + ["true"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=options.connect_timeout + CHECK_SLACK_S,
            )
            if proc.returncode == 0:
                return
            lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            reason = lines[-1] if lines else "ssh exited with code %d" % proc.returncode
        except subprocess.TimeoutExpired:
            reason = "no answer within %.0f s" % (options.connect_timeout + CHECK_SLACK_S)
        except OSError as e:
            reason = "cannot run ssh: %s" % e
        with lock:
            failures[host] = reason

    threads = [threading.Thread(target=probe, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures
