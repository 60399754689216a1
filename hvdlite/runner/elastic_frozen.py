"""The elastic driver's side of frozen workers (FrozenWorkers, one per ElasticDriver).

A worker whose process stops (SIGSTOP, a debugger, a call that hangs every thread) keeps its
sockets open and never exits, so the driver's usual signal, a worker's exit, never comes: the
survivors' collective fails (the core's heartbeat names the frozen rank within
HVDLITE_LIVENESS_SECONDS), they ask for a new generation, and without more the driver would put
the frozen worker into it, where the survivors' init() would wait for it in vain.

So the survivors report it (hvdlite/elastic/worker.py: the "frozen" counter and "frozen/<i>"
records, written before their "reset/<g>" request), and the driver, on the first report naming a
worker that is still running, kills it with SIGKILL (a stopped process cannot handle anything
else) and treats it as a failed worker, exactly as one that exited non-zero: its host is
blacklisted (its host-mates leave with it) and the next generation forms from the survivors.
Only the heartbeat's verdict counts: a worker that is merely slow (computing for minutes, holding
the GIL) still beats, is never reported and never killed.

Contract: kill_reported() runs on the driver's loop thread once per tick; it costs one store
request when nothing was reported, and one more per new report. Reports naming a worker that has
exited, was told to leave, or is not in the current generation are ignored (reported twice, by
both ring neighbours, a worker is killed once).
"""

import json
import signal
from typing import Any


class FrozenWorkers:
    """The frozen workers of one driver (its client, workers, current, hosts, first_failure,
    log() and _signal() are used). Owned by the driver's loop thread."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.seen = 0  # reports 1..seen have been read
        self.killed: set[str] = set()  # ids of the workers killed

    def kill_reported(self) -> bool:
        """Acts on the reports written since the last call; True when it killed a worker (a new
        generation is then needed)."""
        count = self.driver.client.add("frozen", 0)
        killed = False
        while self.seen < count:
            raw = self.driver.client.try_get("frozen/%d" % (self.seen + 1))
            if raw is None:
                break  # its reporter has counted it but not written it yet: next tick
            self.seen += 1
            killed = self._on_report(json.loads(raw)) or killed
        return killed

    def _on_report(self, report: dict[str, Any]) -> bool:
        d = self.driver
        w = d.workers.get(report["worker"])
        if w is None or not w.alive or w.leave_by is not None or w.id not in d.current:
            return False
        if w.id in self.killed:
            return False  # its other neighbour's report
        self.killed.add(w.id)
        d.log(
            "%s (rank %d of generation %d, host %s) stopped responding: %s (reported by %s); "
            "killing it (SIGKILL) and blacklisting host %s"
            % (w.id, report["rank"], report["gen"], w.host, _cause(report["reason"]), report["by"], w.host)
        )
        d._signal(w, signal.SIGKILL)
        if d.first_failure is None:
            d.first_failure = (w.id, -int(signal.SIGKILL))
        d.hosts.blacklist(w.host)
        return True


def _cause(reason: str) -> str:
    """The heartbeat's finding in a reporter's error: "no heartbeat from it for 4 s"."""
    _, _, rest = reason.partition("stopped responding: ")
    return rest.split(" while ", 1)[0] or "no heartbeat"
