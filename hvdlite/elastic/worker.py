"""The worker's side of elastic re-rendezvous: which generation of the job this process is in,
whether a newer one was published, and joining the next one.

Protocol with the elastic driver (hvdlite/runner/elastic_driver.py), through the driver's store
(HVDLITE_ELASTIC_STORE_ADDR, authenticated with HVDLITE_ELASTIC_SECRET):
  - "worker/<id>" = the generation this worker was started into (set before it is spawned);
  - "gen/<g>" = JSON of generation g: {"gen", "store_addr", "secret", "workers": {id: {"rank",
    "size", "hostname", "local": [local rank, local size, cross rank, cross size]}}, "end": null
    or the reason the job ends}; written once, never changed;
  - "latest" = the newest g, set after "gen/<g>";
  - "joined/<id>" = the newest generation this worker formed (set by the worker after init());
  - "reset/<g>": a worker of generation g adds 1 after a HorovodInternalError (a request for a
    new generation, which the driver grants even when no worker exited);
  - "frozen" (a counter) and "frozen/<i>": when that error says a peer stopped responding (the
    core's heartbeat found it frozen: its process stopped while its sockets stay open), the
    worker adds 1 to "frozen" and writes report i = JSON {"worker": the frozen worker's id,
    "rank", "gen", "by": the reporter's id, "reason": the error}, before its "reset/<g>", so the
    driver can kill the frozen process (it would never exit by itself) and re-form without it.
  - "retire/<g>" = JSON list of the ids of workers of generation g that leave the job although
    they are alive (a mesh re-formed on fewer ranks than survived releases them:
    hvdlite/torch/parallel/mesh/state.py), written by its rank 0 before the workers ask for a new
    generation with "reset/<g>"; the driver forms the next one without them and never starts a
    worker in their slots again; they find no place in it and exit 0.
  - "order/<g>" = JSON list of worker ids of generation g in the rank order the next generation
    must give them (a mesh whose replacement worker takes a lost coordinate needs it at that
    coordinate's place in rank order), written by its rank 0 like "retire/<g>"; workers it does
    not name keep the driver's order after those it names.
Every init() of an elastic worker (the script's own hvd.init() included, through the init hook
installed below) joins the newest generation.
Each generation has its own rendezvous store and secret, so the core's init() of generation g
never meets keys or shared-memory names of another. A worker that is not in the next
generation's "workers" leaves (exit status 0); one that finds "end" raises it.
"""

import json
import os
import re
import sys
import time

from hvdlite.common import basics, settings
from hvdlite.common import job as jobs
from hvdlite.common.exceptions import OK, HvdliteInternalError, HvdliteTimeoutError
from hvdlite.elastic.store import StoreClient

SUPERSEDE_WAIT_S = 5.0  # after a failed init(): how long to wait for the driver to publish a newer one
WAIT_NEXT_S = 3600.0  # at most this long for the driver's next generation (it ends the job sooner)
_POLL_S = 0.02
# How the core names a peer its heartbeat found frozen (csrc/transport/tcp_control.cc,
# CheckHeartbeat): "rank N (host H) stopped responding: no heartbeat ...". A survivor that is not
# the frozen rank's neighbour gets it inside an ABORT ("rank M (host H) failed: rank N ...").
_FROZEN = re.compile(r"\brank (\d+)(?: \(host [^)]*\))? stopped responding: no heartbeat")


def frozen_rank(error):
    """The rank `error` says stopped responding (its heartbeat), or None."""
    m = _FROZEN.search(str(error)) if error is not None else None
    return int(m.group(1)) if m else None


class ElasticContext:
    """This process's view of the elastic job. Not thread-safe: used by the run wrapper's thread."""

    def __init__(self):
        self.addr = settings.get("ELASTIC_STORE_ADDR")
        self.worker_id = settings.get("ELASTIC_WORKER_ID")
        self._secret = bytes.fromhex(settings.get("ELASTIC_SECRET"))
        self._client = None
        self.generation = 0  # the generation this process is in (set by current() and _apply())
        self.record = None

    def client(self):
        if self._client is None:
            self._client = StoreClient(self.addr, self._secret)
        return self._client

    def current(self):
        """The record of the generation this process is in."""
        if self.record is None:
            self.generation = int(self.client().get("worker/" + self.worker_id, 30.0))
            self.record = self._read(self.generation)
        return self.record

    def _read(self, gen):
        return json.loads(self.client().get("gen/%d" % gen, 30.0))

    def latest(self):
        """The newest generation the driver has published (never waits)."""
        value = self.client().try_get("latest")
        return int(value) if value is not None else 0

    def newer_generation(self):
        """(latest g, whether it adds workers this generation lacks), or None when this process
        is in the newest generation. Called on rank 0 by State.check_host_updates()."""
        mine = self.current()
        latest = self.latest()
        if latest <= self.generation:
            return None
        record = self._read(latest)
        added = any(w not in mine["workers"] for w in record["workers"])
        return latest, added

    def generations_after(self, gen):
        """[(g, the driver's timestamp of g)] for every generation newer than `gen` the driver has
        published, oldest first (never waits)."""
        return [(g, self._read(g).get("timestamp", 0.0)) for g in range(gen + 1, self.latest() + 1)]

    def wait_next(self):
        """Waits for a generation newer than ours and returns its number."""
        self.current()
        deadline = time.monotonic() + WAIT_NEXT_S
        while True:
            latest = self.latest()
            if latest > self.generation:
                return latest
            if time.monotonic() >= deadline:
                raise HvdliteTimeoutError(
                    "the elastic driver published no new generation of the job in %.0f s" % WAIT_NEXT_S
                )
            time.sleep(_POLL_S)

    def leave(self):
        """Shuts this generation's runtime down. Done before waiting for the next generation: a
        peer that is leaving (a worker whose function raised) waits in its own shutdown() for
        ours."""
        if basics.is_initialized():
            try:
                basics.shutdown()
            except HvdliteInternalError:
                pass  # peers are gone: the runtime is torn down anyway

    def _apply(self, record):
        """Points this process's environment at `record`'s generation; exits this process
        (status 0) when it has no place there; raises when the driver ended the job."""
        if record.get("end"):
            raise HvdliteInternalError(record["end"])
        me = record["workers"].get(self.worker_id)
        if me is None:
            sys.stdout.flush()
            sys.exit(0)  # removed from the job: leave cleanly
        jobs.write(os.environ, jobs.generation_job(record, self.worker_id))
        self.generation, self.record = record["gen"], record

    def init(self, core_init):
        """The core's init() into the newest generation: the init hook of every elastic worker
        (the script's own hvd.init() included). When a generation fails to form because the
        driver superseded it (a worker died meanwhile: the driver stops its store, so this is
        quick), it tries the next one. Returns core_init's (code, message)."""
        self.current()
        while True:
            latest = self.latest()
            if latest > self.generation:
                self._apply(self._read(latest))
            code, message = core_init()
            if code == OK:
                self.client().set("joined/" + self.worker_id, str(self.generation))
                return code, message
            deadline = time.monotonic() + SUPERSEDE_WAIT_S
            while self.latest() <= self.generation and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            if self.latest() <= self.generation:
                return code, message
            sys.stderr.write(
                "hvdlite.elastic: generation %d did not form (%s); joining the next\n"
                % (self.generation, message)
            )

    def report_frozen(self, rank, error):
        """Tells the driver that `rank` of this generation stopped responding (see the protocol
        above); returns the frozen worker's id, or None when `rank` is not in it."""
        record = self.current()
        wid = next((w for w, me in record["workers"].items() if me["rank"] == rank), None)
        if wid is None or wid == self.worker_id:
            return None
        report = {"worker": wid, "rank": rank, "gen": self.generation, "by": self.worker_id}
        report["reason"] = str(error)[:500]
        i = self.client().add("frozen", 1)
        self.client().set("frozen/%d" % i, json.dumps(report))
        return wid

    def started_in(self):
        """The generation the driver started this worker into ("worker/<id>")."""
        return int(self.client().get("worker/" + self.worker_id, 30.0))

    def retire(self, worker_ids):
        """Tells the driver that `worker_ids` of this generation leave the job at its next
        generation (see the protocol above). Rank 0 calls it, then every rank resets."""
        self.current()
        self.client().set("retire/%d" % self.generation, json.dumps(sorted(worker_ids)))

    def order(self, worker_ids):
        """Asks the driver to number the next generation's workers in the order of `worker_ids`
        (see the protocol above). Rank 0 calls it, then every rank resets."""
        self.current()
        self.client().set("order/%d" % self.generation, json.dumps(list(worker_ids)))

    def reset(self, error=None):
        """Moves this process to the next generation (the run wrapper's reset). `error`: what
        ended the last one; a peer it names as frozen is reported to the driver first, which
        kills it (before our shutdown, which then need not wait for it)."""
        rank = frozen_rank(error)
        if rank is not None:
            self.report_frozen(rank, error)
        self.leave()
        # Ask for a new generation: without a worker exit (a stall timeout) the driver has no
        # other reason to form one.
        self.client().add("reset/%d" % self.generation, 1)
        self.wait_next()
        basics.init()  # through init(): joins the newest generation


_context = None


def context():
    """The ElasticContext of this process, or None when no elastic driver started it."""
    global _context
    if _context is None and settings.get("ELASTIC_STORE_ADDR"):
        _context = ElasticContext()
    return _context


def _init_hook(core_init):
    ctx = context()
    return core_init() if ctx is None else ctx.init(core_init)


basics.set_init_hook(_init_hook)
