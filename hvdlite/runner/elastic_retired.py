"""The elastic driver's side of retired workers (RetiredSlots, one per ElasticDriver).

A mesh job (hvdlite/torch/parallel/mesh/state.py) that lost ranks re-forms with fewer
data-parallel replicas than its survivors could fill, so some live workers have no place in it.
Its rank 0 names them in "retire/<g>" (hvdlite/elastic/worker.py), then every worker asks for a
new generation ("reset/<g>"). Before assigning that generation the driver reads the list: the
retired workers are left out (told to leave, like a dropped host's workers, they find no place
in it and exit 0) and their slots get no new worker for the rest of the job (a new worker there
would hold no state for the mesh to place).

A mesh whose replacement worker takes a lost coordinate may also ask, in "order/<g>", for the
rank order of the next generation (the replacement at that coordinate's place; the driver
otherwise numbers new workers after the survivors): ordered() applies it to the assignment.

Contract: open_slots(), ordered() (in _assign()) and requested() (once the workers asked for a new
generation) run on the driver's loop thread; one store request per call.
Only workers of the current generation can be retired; a worker is logged once.
"""

import json


class RetiredSlots:
    """The (host, slot) of every retired worker of one driver (its client, gen, workers,
    current and log() are used). Owned by the driver's loop thread."""

    def __init__(self, driver):
        self._driver = driver
        self.slots: set[tuple[str, int]] = set()

    def open_slots(self, usable):
        """(host, slot) of every slot of `usable` ([(host, slots)], in order) but the retired ones,
        after adding the workers the current generation retired."""
        self._update()
        return [(h, s) for h, slots in usable for s in range(slots) if (h, s) not in self.slots]

    def requested(self):
        """Whether the current generation retired workers: its reset request needs no grace
        (the driver waits REQUEST_GRACE_S for an exit that explains a request; none is coming)."""
        d = self._driver
        if not d.current:
            return False
        return (
            d.client.try_get("retire/%d" % d.gen) is not None
            or d.client.try_get("order/%d" % d.gen) is not None
        )

    def ordered(self, chosen):
        """`chosen` (workers of the next generation, in the driver's order) renumbered as the
        current generation asked ("order/<g>"): the workers it names first, in its order, then the
        others in theirs. A request naming a worker no longer chosen keeps the rest's order."""
        d = self._driver
        value = d.client.try_get("order/%d" % d.gen) if d.current else None
        if not value:
            return chosen
        rank_of = {wid: i for i, wid in enumerate(json.loads(value))}
        return sorted(chosen, key=lambda w: (rank_of.get(w.id, len(rank_of)), chosen.index(w)))

    def _update(self):
        d = self._driver
        value = d.client.try_get("retire/%d" % d.gen) if d.current else None
        for wid in json.loads(value) if value else []:
            w = d.workers.get(wid)
            if w is not None and wid in d.current and (w.host, w.slot) not in self.slots:
                self.slots.add((w.host, w.slot))
                d.log("%s retired by its peers (the mesh re-formed without it): it leaves the job" % wid)
