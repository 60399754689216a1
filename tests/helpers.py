"""The one helper every multi-rank test uses: run a function on N real processes.

    from helpers import run_ranks, spawn_ranks

    def _sum(shape):                       # module level in the test module (pickled by name)
        import hvdlite as hvd
        hvd.init()
        return hvd.allreduce(np.ones(shape), op=hvd.Sum)

    def test_sum():
        for out in run_ranks(_sum, 2, args=((3,),)):
            assert (out == 2).all()

run_pooled(fn, size, ...) has the same contract, but runs in rank processes started once per
pytest session (a RankPool per size and spawn environment) and only gives each case a fresh
store: a case then costs no interpreter start and no torch / TensorFlow import. Most tests use
it; a test that kills ranks or needs a process that never ran hvdlite uses run_ranks.

Contract:
  - Each call starts a fresh TcpStoreServer with a fresh secret and `size` processes from the
    multiprocessing "spawn" context. Child `rank` starts with this environment (in os.environ
    from its first instruction, before the test module is imported again to find fn: what
    TensorFlow reads at import, like TF_USE_LEGACY_KERAS, takes effect): the parent's, plus
    HVDLITE_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE, HVDLITE_CROSS_RANK=0, HVDLITE_CROSS_SIZE=1,
    HVDLITE_STORE_ADDR, HVDLITE_SECRET (hex), OMP_NUM_THREADS=1 (and MKL/OpenBLAS), then the
    `env` overrides: a dict, or a callable rank -> dict; a value of None unsets the variable.
    (The parent's os.environ holds them only while the child process is being started.)
  - fn's return value (picklable) or its formatted traceback comes back over a pipe; a rank
    whose fn raised exits with code 1.
  - spawn_ranks returns [RankResult(rank, exitcode, value, traceback)] without judging them;
    run_ranks returns [value per rank] and raises AssertionError naming every failed rank
    with its traceback, or its exit code / signal when it died without one. Once one rank
    has failed, run_ranks gives the others FAILURE_GRACE_S to finish before killing them.
  - Both raise AssertionError when `timeout` seconds pass with ranks still running, naming
    them. Children are always reaped: whatever happens, none outlives the call.
"""

import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback as _traceback

RankResult = collections.namedtuple("RankResult", "rank exitcode value traceback")

FAILURE_GRACE_S = 10.0  # run_ranks: how long the others may run on after one rank failed
_KILL_WAIT_S = 5.0
_CTX = multiprocessing.get_context("spawn")
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@contextlib.contextmanager
def _environ(env):
    """os.environ with `env` applied (None unsets) inside the block, restored after. The caller
    is the test's main thread; a spawned child inherits the environment of that moment."""
    saved = {key: os.environ.get(key) for key in env}
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _send_result(conn, fn, result):
    """Sends ('ok', value) or ('error', tb) to the parent; a value that does not pickle becomes
    an error naming fn. Returns what was sent."""
    try:
        conn.send(result)
    except Exception:  # the return value does not pickle
        result = (
            "error",
            "the return value of %s could not be sent back:\n%s"
            % (getattr(fn, "__name__", fn), _traceback.format_exc()),
        )
        conn.send(result)
    return result


def _child(fn, args, conn):
    """Body of one rank (its environment is set at its start): run fn, send ('ok', value) or
    ('error', tb)."""
    try:
        result = ("ok", fn(*args))
    except BaseException:
        result = ("error", _traceback.format_exc())
    result = _send_result(conn, fn, result)
    conn.close()
    if result[0] == "error":
        sys.stderr.write(result[1])
        sys.stderr.flush()
        sys.exit(1)


def _rank_env(rank, size, store_addr, secret_hex, env):
    out = {
        "HVDLITE_RANK": rank,
        "HVDLITE_SIZE": size,
        "HVDLITE_LOCAL_RANK": rank,
        "HVDLITE_LOCAL_SIZE": size,
        "HVDLITE_CROSS_RANK": 0,
        "HVDLITE_CROSS_SIZE": 1,
        "HVDLITE_STORE_ADDR": store_addr,
        "HVDLITE_SECRET": secret_hex,
    }
    out.update({k: 1 for k in _THREAD_VARS})
    extra = env(rank) if callable(env) else env
    out.update(extra or {})
    return out


def _describe_exit(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            return "killed by signal %s (exit code %d)" % (signal.Signals(-code).name, code)
        except ValueError:
            return "killed by signal %d" % -code
    return "exit code %d" % code


def _fn_name(fn):
    return "%s.%s" % (getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", fn))


def _stop(procs):
    """Terminates, then kills, every process still alive; reaps all of them (bounded)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _KILL_WAIT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(_KILL_WAIT_S)


def _run(fn, size, args, timeout, env, failure_grace):
    """Runs the ranks; returns (results, ranks still running at the deadline, ranks that
    sent a message)."""
    from hvdlite import _core

    secret = os.urandom(32)
    server = _core.TcpStoreServer("127.0.0.1", 0, secret)
    procs, readers, messages = [], {}, {}
    try:
        addr = "127.0.0.1:%d" % server.port
        for rank in range(size):
            reader, writer = _CTX.Pipe(duplex=False)
            p = _CTX.Process(
                target=_child,
                name="rank-%d" % rank,
                args=(fn, tuple(args), writer),
            )
            with _environ(_rank_env(rank, size, addr, secret.hex(), env)):
                p.start()
            writer.close()  # only the child holds the write end: its death means EOF for us
            procs.append(p)
            readers[reader] = rank
        deadline = time.monotonic() + timeout
        pending = set(range(size))  # ranks whose process has not exited yet
        by_rank = {rank: reader for reader, rank in readers.items()}

        def receive(rank, wait_s):
            """Reads rank's message (if any arrives within wait_s); closes its pipe."""
            reader = by_rank.pop(rank, None)
            if reader is None:
                return
            del readers[reader]
            try:
                if reader.poll(wait_s):
                    messages[rank] = reader.recv()
            except (EOFError, OSError):
                pass  # died without sending anything
            reader.close()

        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables = list(readers) + [procs[r].sentinel for r in pending]
            for ready in multiprocessing.connection.wait(waitables, left):
                if ready in readers:
                    receive(readers[ready], 0)
            for rank in sorted(pending):
                exited = procs[rank].exitcode is not None
                if exited:
                    receive(rank, 1.0)  # the message may trail the exit by a moment
                    pending.discard(rank)
                ok = messages.get(rank, ("ok",))[0] == "ok" and procs[rank].exitcode in (None, 0)
                if not ok and failure_grace is not None:
                    deadline = min(deadline, time.monotonic() + failure_grace)
        still_running = sorted(pending)
    finally:
        _stop(procs)
        for reader in readers:
            reader.close()
        server.stop()
    results = []
    for rank, p in enumerate(procs):
        kind, payload = messages.get(rank, (None, None))
        results.append(
            RankResult(
                rank, p.exitcode, payload if kind == "ok" else None, payload if kind == "error" else None
            )
        )
    return results, still_running, set(messages)


def _timeout_error(fn, size, timeout, results, still_running):
    lines = [
        "%s on %d ranks timed out after %.0f s; ranks still running (now killed): %s"
        % (_fn_name(fn), size, timeout, still_running)
    ]
    for r in results:
        if r.rank in still_running and (r.value is not None or r.traceback):
            lines.append(
                "rank %d %s from fn but its process did not exit (a hang in shutdown or at exit?)%s"
                % (r.rank, "raised" if r.traceback else "returned", "\n" + r.traceback if r.traceback else "")
            )
        elif r.rank not in still_running:
            lines.append(
                "rank %d finished: %s%s"
                % (r.rank, _describe_exit(r.exitcode), "\n" + r.traceback if r.traceback else "")
            )
    return AssertionError("\n".join(lines))


def spawn_ranks(fn, size, args=(), timeout=60.0, env=None):
    """Runs fn(*args) on `size` ranks; returns [RankResult] in rank order, failures included.
    Raises AssertionError only on timeout."""
    results, still_running, _ = _run(fn, size, args, timeout, env, failure_grace=None)
    if still_running:
        raise _timeout_error(fn, size, timeout, results, still_running)
    return results


def run_ranks(fn, size, args=(), timeout=60.0, env=None):
    """Runs fn(*args) on `size` ranks; returns each rank's return value, in rank order.
    Raises AssertionError describing every failed rank, or the ranks still running at the
    timeout."""
    results, still_running, answered = _run(fn, size, args, timeout, env, FAILURE_GRACE_S)
    return judge(fn, size, timeout, results, still_running, answered)


def judge(fn, size, timeout, results, still_running, answered):
    """run_ranks' verdict on one job: the values in rank order, or AssertionError naming every
    failed rank with its traceback (or the ranks still running at the timeout)."""
    failed = [
        r
        for r in results
        if r.rank not in still_running
        and (r.exitcode != 0 or r.traceback is not None or r.rank not in answered)
    ]
    if still_running and not failed:
        raise _timeout_error(fn, size, timeout, results, still_running)
    if failed:
        lines = ["%s failed on %d of %d ranks" % (_fn_name(fn), len(failed), size)]
        for r in failed:
            if r.traceback:
                lines.append(
                    "--- rank %d (%s) ---\n%s" % (r.rank, _describe_exit(r.exitcode), r.traceback.rstrip())
                )
            elif r.exitcode == 0:
                lines.append("--- rank %d exited with code 0 without returning from fn ---" % r.rank)
            else:
                lines.append(
                    "--- rank %d died without a traceback: %s (its own output, if "
                    "any, is in the captured stderr) ---" % (r.rank, _describe_exit(r.exitcode))
                )
        if still_running:
            lines.append(
                "--- ranks %s were still running %.0f s after the first failure "
                "and were killed ---" % (still_running, FAILURE_GRACE_S)
            )
        raise AssertionError("\n".join(lines))
    return [r.value for r in results]


# ---- RankPool: rank processes started once, many cases run in them ----


def _reset_rank():
    """After a pooled case: shut hvdlite down if the case left it initialized, so the next case
    starts from a clean process (its init() makes a new job with the new store)."""
    basics = sys.modules.get("hvdlite.common.basics")
    if basics is not None and basics.is_initialized():
        basics.shutdown()


def _pool_child(conn):
    """Body of one pooled rank: runs (fn, args, env) cases until it receives None. A case's env
    is applied to os.environ for the case and restored after."""
    while True:
        case = conn.recv()
        if case is None:
            return
        fn, args, env = case
        with _environ(env):
            try:
                result = ("ok", fn(*args))
                _reset_rank()
            except BaseException:
                result = ("error", _traceback.format_exc())
        _send_result(conn, fn, result)


class RankPool:
    """`size` rank processes started on first use and reused by every run(): run(fn, args,
    timeout, env) has run_ranks' contract (the values in rank order; AssertionError naming each
    failed rank with its traceback, or the ranks still running at the timeout), and each run
    gets a fresh TcpStoreServer and secret, so it is a new job. What a rank imports stays
    imported: the point of the pool, and why `spawn_env` (what a framework reads when it is
    imported, e.g. TF_USE_LEGACY_KERAS) is fixed for the pool's life. A case that fails or
    times out stops the processes (a failed rank may have left its peers in a collective); the
    next run starts new ones. Not for cases that kill ranks or test init() itself from a clean
    process: those use run_ranks."""

    def __init__(self, size, spawn_env=None):
        self.size = size
        self.spawn_env = dict(spawn_env or {})
        self._procs, self._conns = [], []

    def _start(self):
        for rank in range(self.size):
            parent, child = _CTX.Pipe()
            p = _CTX.Process(target=_pool_child, name="pooled-rank-%d" % rank, args=(child,))
            with _environ(_rank_env(rank, self.size, "", "", self.spawn_env)):
                p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)

    def close(self):
        """Asks each rank to return, gives them a moment, then stops them (a rank that imported
        TensorFlow takes seconds to exit on its own; nothing of a finished case is lost)."""
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 0.5
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        _stop(self._procs)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def run(self, fn, args=(), timeout=60.0, env=None):
        from hvdlite.common.native import core

        if any(p.exitcode is not None for p in self._procs):
            self.close()  # a rank died between cases (killed from outside): start afresh
        if not self._procs:
            self._start()
        secret = os.urandom(32)
        server = core.TcpStoreServer("127.0.0.1", 0, secret)
        try:
            addr = "127.0.0.1:%d" % server.port
            for rank, conn in enumerate(self._conns):
                case_env = {"HVDLITE_STORE_ADDR": addr, "HVDLITE_SECRET": secret.hex()}
                extra = env(rank) if callable(env) else env
                case_env.update(extra or {})
                conn.send((fn, tuple(args), case_env))
            messages, still_running = self._collect(timeout)
        finally:
            server.stop()
        results = []
        for rank, p in enumerate(self._procs):
            kind, payload = messages.get(rank, (None, None))
            code = p.exitcode if p.exitcode is not None else (0 if rank in messages else None)
            results.append(
                RankResult(
                    rank, code, payload if kind == "ok" else None, payload if kind == "error" else None
                )
            )
        if len(messages) < self.size or any(kind != "ok" for kind, _ in messages.values()):
            self.close()  # a failed case may leave ranks inside a collective: start afresh
        return judge(fn, self.size, timeout, results, still_running, set(messages))

    def _collect(self, timeout):
        """Waits for every rank's answer (FAILURE_GRACE_S more once one failed or died);
        returns ({rank: message}, ranks that never answered)."""
        deadline = time.monotonic() + timeout
        messages, pending = {}, set(range(self.size))
        while pending and time.monotonic() < deadline:
            waitables = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            multiprocessing.connection.wait(waitables, deadline - time.monotonic())
            for rank in sorted(pending):
                conn, died = self._conns[rank], self._procs[rank].exitcode is not None
                try:
                    if conn.poll(0):
                        messages[rank] = conn.recv()
                except (EOFError, OSError):
                    died = True  # its end of the pipe closed: it is exiting
                if rank in messages or died:  # a rank that died unanswered: judge() names its exit
                    pending.discard(rank)
                    if messages.get(rank, ("error",))[0] != "ok":
                        deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        return messages, sorted(pending)


# The spawn environment of TensorFlow's pooled ranks (run_pooled(..., spawn_env=TF_SPAWN_ENV)):
# what TensorFlow reads once, at import or when its runtime starts. Keras 3, quiet logs, and one
# inter-op and one intra-op thread per rank (2-core machines; tests/test_tf_graph_order.py needs
# the single inter-op thread). Keras 2 tests add TF_USE_LEGACY_KERAS=1 and get pools of their own.
TF_SPAWN_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_USE_LEGACY_KERAS": "0",
}

# The pools run_pooled uses: one per (size, spawn environment), for the whole pytest session.
_POOLS = {}


def run_pooled(fn, size, args=(), timeout=60.0, env=None, spawn_env=None):
    """run_ranks' contract (and arguments), run in the session's RankPool of `size` ranks
    started with `spawn_env`: the processes, and what they imported, are reused by every test
    that asks for the same size and spawn environment. For cases that do not kill ranks or
    need a process that never ran hvdlite; `env` is per case, `spawn_env` what must be in the
    environment before the first import (TF_USE_LEGACY_KERAS, TF_NUM_INTEROP_THREADS)."""
    key = (size, tuple(sorted((spawn_env or {}).items())))
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = RankPool(size, spawn_env)
    return pool.run(fn, args, timeout, env)


def close_pools():
    """Stops every pool's processes (the session's end: tests/conftest.py)."""
    while _POOLS:
        _POOLS.popitem()[1].close()
