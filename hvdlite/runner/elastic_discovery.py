"""Hosts for the elastic driver: where they come from (a discovery script or a fixed -H list),
their stable order, and the blacklist of hosts whose workers failed (Horovod's semantics).

  - A discovery script prints one `host[:slots]` per line (slots default: --slots-per-host,
    else 1). A non-zero exit status is fatal on the first call, a transient warning later.
  - Host order is first-seen order: hosts found again keep their place, new hosts go last, so
    surviving older hosts keep the lowest ranks.
  - A blacklisted host gets no workers. Without a cooldown range it stays blacklisted; with
    (lo, hi) it returns after a cooldown of lo * 2**n + uniform(0, lo) seconds clamped to
    [lo, hi], n = how many times it was blacklisted (Horovod's exponential back-off).
"""

import random
import subprocess
import time

from hvdlite.common.exceptions import HvdliteError, InvalidArgumentError

DISCOVERY_TIMEOUT_S = 60.0


class DiscoveryError(HvdliteError):
    """The host discovery script failed or printed something that is not host[:slots]."""


def parse_host_line(text, default_slots):
    """'host' or 'host:slots' -> (host, slots)."""
    host, sep, slots = text.strip().rpartition(":")
    if not sep:
        host, slots = slots, ""
    if not host:
        raise InvalidArgumentError("'%s' is not host[:slots]" % text)
    try:
        n = int(slots) if slots else default_slots
    except ValueError:
        raise InvalidArgumentError("'%s' is not host[:slots]: slots must be an integer" % text) from None
    if n < 0:
        raise InvalidArgumentError("'%s': slots must not be negative" % text)
    return host, n


def parse_hosts(text, default_slots=1):
    """'a:2,b' (the -H form) -> {'a': 2, 'b': 1}, in order."""
    out = {}
    for item in text.split(","):
        if item.strip():
            host, slots = parse_host_line(item, default_slots)
            out[host] = slots
    return out


class FixedHosts:
    """-H with --min-np: the same hosts every time (fault tolerance without discovery)."""

    def __init__(self, hosts):
        self._hosts = dict(hosts)

    def find(self):
        return dict(self._hosts)


class DiscoveryScript:
    def __init__(self, script, default_slots=None):
        self.script = script
        self.default_slots = default_slots or 1

    def find(self):
        """{host: slots} from one run of the script; raises DiscoveryError when it fails."""
        try:
            done = subprocess.run(
                self.script, shell=True, capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise DiscoveryError(
                "host discovery script %r ran past %.0f s" % (self.script, DISCOVERY_TIMEOUT_S)
            ) from None
        if done.returncode != 0:
            raise DiscoveryError(
                "host discovery script %r exited with status %d: %s"
                % (self.script, done.returncode, done.stderr.strip()[-500:])
            )
        hosts = {}
        for line in done.stdout.splitlines():
            if line.strip():
                try:
                    host, slots = parse_host_line(line, self.default_slots)
                except InvalidArgumentError as e:
                    raise DiscoveryError("host discovery script %r: %s" % (self.script, e)) from None
                hosts[host] = slots
        return hosts


class HostManager:
    """Discovered hosts, their order and blacklist. Used by the driver's thread only."""

    def __init__(self, discovery, cooldown_range=None):
        if cooldown_range is not None:
            lo, hi = cooldown_range
            if not 0 < lo <= hi:
                raise InvalidArgumentError(
                    "--blacklist-cooldown-range %s %s: want 0 < min <= max seconds" % (lo, hi)
                )
        self.discovery = discovery
        self.cooldown_range = cooldown_range
        self.slots = {}  # host -> slots, as last discovered
        self.order = []  # every host ever seen, first-seen first
        self._blacklist = {}  # host -> time it may return (inf: never)
        self._blacklist_count = {}
        self._last_usable = []  # usable() as of the last apply()

    def apply(self, found):
        """Takes {host: slots} from a discovery run; returns True when the usable hosts or their
        slots changed."""
        self.slots = dict(found)
        # A host that disappeared loses its place: if it comes back, it goes last.
        self.order = [h for h in self.order if h in found]
        for host in found:
            if host not in self.order:
                self.order.append(host)
        now = self.usable()
        changed, self._last_usable = now != self._last_usable, now
        return changed  # also when a blacklisted host's cooldown ended since the last call

    def blacklist(self, host):
        n = self._blacklist_count.get(host, 0) + 1
        self._blacklist_count[host] = n
        if self.cooldown_range is None:
            self._blacklist[host] = float("inf")
            return
        lo, hi = self.cooldown_range
        delay = max(lo, min(hi, lo * (1 << n) + random.uniform(0, 1) * lo))
        self._blacklist[host] = time.monotonic() + delay
        # A host that comes back goes to the end of the order, like a new one.
        if host in self.order:
            self.order.remove(host)
            self.order.append(host)

    def is_blacklisted(self, host):
        until = self._blacklist.get(host)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._blacklist[host]
            return False
        return True

    def usable(self):
        """[(host, slots)] in assignment order, blacklisted and empty hosts left out."""
        return [
            (h, self.slots[h]) for h in self.order if self.slots.get(h, 0) > 0 and not self.is_blacklisted(h)
        ]

    def available_slots(self):
        return sum(slots for _, slots in self.usable())
