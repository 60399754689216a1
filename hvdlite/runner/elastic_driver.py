"""The elastic driver of `hvdliterun --min-np/--max-np/--host-discovery-script`: starts workers
on the discovered hosts, and when workers die or hosts come and go, publishes the next
*generation* of the job for the survivors (and new workers) to re-form into in-process.

Contract of ElasticDriver.run():
  - hosts its own TCP store (the job secret admits workers) and, per generation, a fresh
    rendezvous store with a fresh secret; the records it writes are described in
    hvdlite/elastic/worker.py;
  - a worker exiting non-zero blacklists its host (hvdlite/runner/elastic_discovery.py); its
    host's other workers are told to leave; the survivors (older hosts first, so they keep the
    lowest ranks) plus new workers on free slots, up to --max-np, form the next generation;
  - a worker the survivors report frozen (its heartbeat stopped; it never exits) is SIGKILLed
    and then handled as a failed worker (hvdlite/runner/elastic_frozen.py);
  - a discovery change that changes the assignment forms the next generation too (the workers
    learn it at their next commit());
  - workers that ask for a new generation (key "reset/<g>") with no worker exit get one with the
    same workers after REQUEST_GRACE_S (a stall timeout raises HorovodInternalError everywhere);
  - below --min-np it waits up to --elastic-timeout for hosts, then ends the job; every
    re-formation counts against --reset-limit;
  - the first worker to exit 0 ends the training: no more generations form, and workers
    started for a generation that worker never joined leave (an empty generation);
  - returns 0 when the workers of the last generation all exit 0; otherwise non-zero with
    Horovod's launcher message. Each worker is named host[slot]; output lines are prefixed
    [host[slot]]<stdout>:. Workers on local hosts (localhost, 127.x, this host's name or
    addresses) start directly; on other hosts over ssh, exactly as multi-host ranks
    (remote.rank_launch: env on the command line, secrets on ssh's stdin, the worker's process
    group on its host killed when its ssh ends), and stopping one means killing its ssh;
  - the stores listen on loopback when every host found at start is local, else on the address
    that reaches the remote hosts (hosts.store_address, --network-interfaces first); with
    loopback stores, remote hosts discovered later are ignored (they could not reach them).
"""

import json
import os
import queue
import signal
import sys
import threading
import time
from typing import Any

from hvdlite.common import job as jobs
from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.elastic.store import StoreClient
from hvdlite.runner import elastic_discovery, elastic_frozen, elastic_retired, job, remote
from hvdlite.runner import hosts as hostlib
from hvdlite.runner.output import Console

DISCOVERY_INTERVAL_S = 1.0
FAILURE_BATCH_S = 0.1  # exits this close together form one new generation
LEAVE_GRACE_S = 30.0  # a worker told to leave is killed after this long
END_GRACE_S = 15.0  # after the job ended, how long workers may take to exit before SIGKILL
_TICK_S = 0.2
REQUEST_GRACE_S = 0.5  # a reset request with no worker exit re-forms the same workers after this

NONZERO_MESSAGE = (
    "Horovod detected that one or more processes exited with non-zero "
    "status, thus causing the job to be terminated. The first process "
    "to do so was:\nProcess name: {name}\nExit code: {code}\n"
)
RESET_LIMIT_EXCEEDED_MESSAGE = (
    "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"
)
NO_SURVIVOR_MESSAGE = "No hosts from previous set remaining, unable to broadcast state."
MIN_SLOTS_TIMEOUT_MESSAGE = (
    "Timed out waiting for minimum number of slots to become available. Please check that you "
    "have enough resources to run at least {} Horovod processes."
)


class _Worker:
    def __init__(self, wid, host, slot):
        self.id, self.host, self.slot = wid, host, slot
        self.proc = None
        self.code = None  # exit status once reaped
        self.leave_by = None  # set when told to leave: kill after this time

    @property
    def alive(self):
        return self.code is None


class ElasticDriver:
    def __init__(
        self,
        command,
        np,
        min_np,
        max_np,
        hosts,
        elastic_timeout=600.0,
        reset_limit=None,
        base_env=None,
        verbose=False,
        ssh_options=None,
        network_interfaces=None,
    ):
        self.command = list(command)
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.hosts = hosts  # elastic_discovery.HostManager
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.verbose = verbose
        self.ssh_options = ssh_options or remote.SshOptions()
        self.network_interfaces = network_interfaces
        self.store_host = hostlib.LOOPBACK  # set by run(): where the stores listen
        self._local: dict[str, bool] = {}  # host -> hostlib.is_local(host), decided once
        self._ignored: set[str] = set()  # remote hosts ignored because the stores are on loopback
        self.secret = os.urandom(32)
        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        console = Console(sys.stdout, sys.stderr)  # one live-row terminal model for all workers
        self._out, self._err = console.stdout, console.stderr
        self.workers = {}  # id -> _Worker, every worker ever started
        self.current = []  # ids of the current generation, in rank order
        self.gen = 0
        self.resets = 0
        self._spawned = {}  # (host, slot) -> how many workers were started there
        self._stores = []  # the rendezvous servers of the last generations
        self._readers = []  # output reader threads, joined (bounded) before run() returns
        self._stop = threading.Event()
        self.first_failure: tuple[str, int] | None = None  # (name, code)
        self._request_seen: float | None = None  # when a reset request for self.gen was first seen
        self._frozen = elastic_frozen.FrozenWorkers(self)  # workers the survivors report frozen
        self._retired = elastic_retired.RetiredSlots(self)  # workers their peers retired leave the job

    def log(self, msg):
        self._err.write(("hvdliterun: %s\n" % msg).encode())

    # -- stores and generations --------------------------------------------------------------
    def _publish(self, assignment, end=None):
        """Writes generation gen+1: assignment = [(worker id, host)] in rank order."""
        self.gen += 1
        secret = os.urandom(32)
        server = None
        if end is None and len(assignment) > 1:
            from hvdlite.common.native import core as _core

            server = _core.TcpStoreServer(self.store_host, 0, secret, clients=len(assignment))
        # A superseded generation's store goes at once: a worker still forming that generation
        # fails fast and joins the newest one (hvdlite/elastic/worker.py). Formed generations no
        # longer need their store, except for a first CUDA tensor's NCCL setup (that then fails
        # with HorovodInternalError: rolled back to the last commit, like any failure).
        while self._stores:
            self._stores.pop().stop()
        if server is not None:
            self._stores.append(server)
        record = {
            "gen": self.gen,
            "timestamp": time.time(),  # State._host_messages carries it, as Horovod's does
            "store_addr": "%s:%d" % (self.store_host, server.port) if server else "",
            "secret": secret.hex(),
            "workers": {
                wid: {"rank": r, "size": len(assignment), "hostname": host, "local": local}
                for r, ((wid, host), local) in enumerate(
                    zip(assignment, jobs.topology([h for _, h in assignment]))
                )
            },
            "end": end,
        }
        for wid, _ in assignment:
            if wid not in self.workers or self.workers[wid].proc is None:
                self.client.set("worker/" + wid, str(self.gen))
        self.client.set("gen/%d" % self.gen, json.dumps(record))
        self.client.set("latest", str(self.gen))
        return record

    # -- workers -----------------------------------------------------------------------------
    def is_local(self, host):
        if host not in self._local:
            self._local[host] = hostlib.is_local(host)
        return self._local[host]

    def _worker_env(self, w, record):
        """The environment of worker w started into generation `record`: base_env, its job in
        that generation and the elastic driver's store (hvdlite/elastic/worker.py)."""
        me = record["workers"][w.id]
        env = jobs.write(dict(self.base_env), jobs.generation_job(record, w.id))
        env.update(
            {
                "HVDLITE_ELASTIC_STORE_ADDR": "%s:%d" % (self.store_host, self.server.port),
                "HVDLITE_ELASTIC_SECRET": self.secret.hex(),
                "HVDLITE_ELASTIC_WORKER_ID": w.id,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.verbose:
            self.log(
                "starting %s as rank %d of %d (generation %d)" % (w.id, me["rank"], me["size"], record["gen"])
            )
        return env

    # The methods below are how workers are started, stopped and described: processes, local or
    # over ssh, here; srun steps in elastic_srun.py; Ray actors in hvdlite/ray/elastic.py.
    def _spawn(self, w, record):
        """Starts worker w into generation `record`: sets w.proc (whose wait() returns the exit
        status) and puts ("exit", w, status) on the event queue once it ends."""
        argv, popen_env, data = self._launch(w, self._worker_env(w, record))
        w.proc = job.start_rank(argv, popen_env, data)
        for pipe, name, sink in ((w.proc.stdout, "stdout", self._out), (w.proc.stderr, "stderr", self._err)):
            prefix = ("[%s]<%s>:" % (w.id, name)).encode()
            reader = threading.Thread(target=job._pump, args=(pipe, prefix, sink), daemon=True)
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._reap, args=(w,), daemon=True).start()

    def _launch(self, w, env):
        """(argv, environment, stdin bytes or None) of the process that runs worker w: the
        command itself on a local host, ssh on another (hvdlite/runner/elastic_srun.py: srun)."""
        return remote.rank_launch(
            w.host, self.command, env, self.ssh_options, self.is_local(w.host), self.base_env
        )

    def _reap(self, w):
        self._events.put(("exit", w, w.proc.wait()))

    def _signal(self, w, signum):
        if w.proc is not None and w.alive:
            try:
                os.killpg(w.proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _describe_exit(self, w, code):
        return job.describe_exit(code) if self.is_local(w.host) else job.describe_remote_exit(code)

    def _store_host(self, found):
        """Where the stores listen, for the hosts found at start (module doc)."""
        return hostlib.store_address([h for h in found if not self.is_local(h)], self.network_interfaces)

    # -- assignment --------------------------------------------------------------------------
    def _assign(self):
        """The next generation's [(worker id, host)] in rank order, or None below min-np.
        Live workers of the current generation keep their (host, slot); free slots of usable
        hosts get new workers, up to max-np."""
        live = {
            (w.host, w.slot): w
            for w in (self.workers[i] for i in self.current)
            if w.alive and w.leave_by is None
        }
        out: list[_Worker] = []
        for host, slot in self._retired.open_slots(self.hosts.usable()):  # no retired worker's slot
            if self.max_np is not None and len(out) >= self.max_np:
                break
            w = live.get((host, slot))
            if w is None:
                k = self._spawned.get((host, slot), 0)
                wid = "%s[%d]" % (host, slot) + (".%d" % k if k else "")
                w = _Worker(wid, host, slot)
            out.append(w)
        if len(out) < self.min_np:
            return None
        # Survivors first (in host order), new workers after them: the new rank 0, which every
        # rank syncs its state from, is always a worker that has the state; unless the current
        # generation asked for another order (a mesh placing a replacement: elastic_retired.py),
        # where every worker named is running already.
        return self._retired.ordered(
            [w for w in out if w.proc is not None] + [w for w in out if w.proc is None]
        )

    def _form(self, chosen):
        """Publishes the generation of `chosen` workers, tells the dropped ones to leave and
        starts the new ones."""
        for wid in self.current:
            w = self.workers[wid]
            if w.alive and w not in chosen and w.leave_by is None:
                w.leave_by = time.monotonic() + LEAVE_GRACE_S
        record = self._publish([(w.id, w.host) for w in chosen])
        for w in chosen:
            if w.id not in self.workers:
                self.workers[w.id] = w
                self._spawned[(w.host, w.slot)] = self._spawned.get((w.host, w.slot), 0) + 1
                self._spawn(w, record)
        self.current = [w.id for w in chosen]
        self.log("generation %d: %d worker(s): %s" % (self.gen, len(chosen), ", ".join(w.id for w in chosen)))

    # -- discovery ---------------------------------------------------------------------------
    def _discover(self):
        while not self._stop.wait(DISCOVERY_INTERVAL_S):
            try:
                self._events.put(("hosts", self.hosts.discovery.find()))
            except elastic_discovery.DiscoveryError as e:
                self.log("%s (will retry)" % e)

    # -- main loop ---------------------------------------------------------------------------
    def run(self):
        from hvdlite.common.native import core as _core

        found = self.hosts.discovery.find()  # a failure here is fatal
        try:
            self.store_host = self._store_host(found)
        except (InvalidArgumentError, OSError) as e:
            self.log(str(e))
            return 2
        self.hosts.apply(self._reachable(found))
        self.server = _core.TcpStoreServer(self.store_host, 0, self.secret)
        self.client = StoreClient("%s:%d" % (self.store_host, self.server.port), self.secret)
        threading.Thread(target=self._discover, daemon=True).start()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                previous[s] = signal.signal(s, self._on_signal)
        try:
            return self._loop()
        finally:
            self._stop.set()
            for s, h in previous.items():
                signal.signal(s, h)
            for w in self.workers.values():
                self._signal(w, signal.SIGKILL)
            deadline = time.monotonic() + job.READER_JOIN_S
            for reader in self._readers:
                reader.join(max(0.0, deadline - time.monotonic()))
            self.client.close()
            for server in self._stores:
                server.stop()
            self.server.stop()

    def _reachable(self, found):
        """`found` less the remote hosts when the stores listen on loopback (logged once each)."""
        if self.store_host != hostlib.LOOPBACK:
            return found
        out = {}
        for host, slots in found.items():
            if self.is_local(host):
                out[host] = slots
            elif host not in self._ignored:
                self._ignored.add(host)
                self.log(
                    "ignoring remote host %s: every host found at start was local, so the stores "
                    "listen on loopback (start with a remote host, or pass --network-interfaces)" % host
                )
        return out

    def _on_signal(self, signum, frame):
        self._events.put(("signal", signum))

    def _loop(self):
        need = self.np
        wait_since = time.monotonic()
        pending_change = True  # the first generation
        finishing = False
        while True:
            if pending_change and not finishing:
                chosen = self._assign()
                if chosen is not None and self.current and chosen[0].proc is None:
                    return self._end(NO_SURVIVOR_MESSAGE)
                if chosen is not None and (self.current or len(chosen) >= need):
                    if self.current and self.reset_limit is not None and self.resets >= self.reset_limit:
                        return self._end(RESET_LIMIT_EXCEEDED_MESSAGE.format(self.reset_limit))
                    if self.current:
                        self.resets += 1
                    self._form(chosen)
                    pending_change = False
                    need = self.min_np
                elif time.monotonic() - wait_since > self.elastic_timeout:
                    return self._end(MIN_SLOTS_TIMEOUT_MESSAGE.format(need), report_failure=True)
            self._kill_overdue_leavers()
            killed = self._frozen.kill_reported()
            if not finishing and (killed or (not pending_change and self._reset_requested())):
                pending_change, wait_since = True, time.monotonic()
            if not any(self.workers[i].alive for i in self.current) and (finishing or not self._survivors()):
                return self._result()
            try:
                event = self._events.get(timeout=_TICK_S)
            except queue.Empty:
                continue
            batch = [event]
            deadline = time.monotonic() + FAILURE_BATCH_S
            while True:
                try:
                    batch.append(self._events.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            for ev in batch:
                kind = ev[0]
                if kind == "signal":
                    self.log("got %s: stopping every worker" % signal.Signals(ev[1]).name)
                    for w in self.workers.values():
                        self._signal(w, signal.SIGTERM)
                    self._wait_exit(END_GRACE_S)
                    return 128 + ev[1]
                if kind == "hosts":
                    if self.hosts.apply(self._reachable(ev[1])) and self.current:
                        chosen = self._assign()
                        if chosen is None or [w.id for w in chosen] != self.current:
                            pending_change, wait_since = True, time.monotonic()
                    continue
                _, w, code = ev
                w.code = code
                if w.leave_by is not None or w.id not in self.current:
                    continue  # told to leave: any exit is fine
                if code == 0:
                    if not finishing:
                        self._dismiss_unformed(w)
                    finishing = True  # the training loop is done: no more re-forming
                    continue
                if self.first_failure is None:
                    self.first_failure = (w.id, code)
                how = self._describe_exit(w, code)
                self.log("%s %s; blacklisting host %s" % (w.id, how, w.host))
                self.hosts.blacklist(w.host)
                if not finishing:
                    pending_change, wait_since = True, time.monotonic()
            if pending_change and not finishing and not self._survivors():
                return self._fail()

    def _dismiss_unformed(self, w):
        """The training is done (w exited 0). When w last formed an older generation than the
        newest (new workers were started for it while the others finished their last steps),
        that generation can never form: an empty one is published, from which the workers
        waiting for it leave with status 0 (hvdlite/elastic/worker.py)."""
        joined = self.client.try_get("joined/" + w.id)
        if joined is not None and int(joined) < self.gen:
            self.log("%s finished in generation %s: ending generation %d" % (w.id, joined.decode(), self.gen))
            self._publish([])

    def _reset_requested(self):
        """True once the current generation's workers asked for a new one (after any
        HorovodInternalError: a stall timeout, say, where no process exits) and REQUEST_GRACE_S
        passed with no exit explaining it (an exit re-forms anyway); at once if they retired some."""
        if self.client.try_get("reset/%d" % self.gen) is None:
            self._request_seen = None
            return False
        now = time.monotonic()
        if self._request_seen is None:
            self._request_seen = now
        return now - self._request_seen >= REQUEST_GRACE_S or self._retired.requested()

    def _survivors(self):
        return [
            i
            for i in self.current
            if self.workers[i].alive
            and self.workers[i].leave_by is None
            and not self.hosts.is_blacklisted(self.workers[i].host)
        ]

    def _kill_overdue_leavers(self):
        now = time.monotonic()
        for w in self.workers.values():
            if w.alive and w.leave_by is not None and now > w.leave_by:
                self.log("%s did not leave within %.0f s: killing it" % (w.id, LEAVE_GRACE_S))
                self._signal(w, signal.SIGKILL)
                w.leave_by = float("inf")

    def _wait_exit(self, grace):
        deadline = time.monotonic() + grace
        while any(w.alive and w.proc is not None for w in self.workers.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                for w in self.workers.values():
                    self._signal(w, signal.SIGKILL)
                left = 5.0
                deadline = time.monotonic() + left
                grace = -1
            try:
                ev = self._events.get(timeout=min(left, _TICK_S))
            except queue.Empty:
                if grace < 0 and time.monotonic() >= deadline:
                    return
                continue
            if ev[0] == "exit":
                ev[1].code = ev[2]

    def _end(self, message, report_failure=False):
        """Ends the job: workers waiting for a generation get `message` raised; exits non-zero.
        report_failure: a worker's failure led here (too few slots were left after it), so it is
        reported too, as Horovod's launcher does, and its exit code returned."""
        self._publish([], end=message)
        self._wait_exit(END_GRACE_S)
        self.log(message)
        if report_failure and self.first_failure is not None:
            name, code = self.first_failure
            self.log(NONZERO_MESSAGE.format(name=name, code=code).rstrip())
            return code if 0 < code < 256 else 1
        return 1

    def _fail(self):
        """No worker of the current generation can go on: ends the job with the first failure."""
        name, code = self.first_failure or ("?", 1)
        self._end(NONZERO_MESSAGE.format(name=name, code=code).rstrip())
        return code if 0 < code < 256 else 1

    def _result(self):
        self._wait_exit(END_GRACE_S)
        failed = [(self.workers[i].id, self.workers[i].code) for i in self.current if self.workers[i].code]
        first = failed[0] if failed else self.first_failure if not self._all_ok() else None
        if first is None:
            return 0
        name, code = first
        self.log(NONZERO_MESSAGE.format(name=name, code=code).rstrip())
        return code if 0 < code < 256 else 1

    def _all_ok(self):
        return bool(self.current) and all(self.workers[i].code == 0 for i in self.current)
