"""Hosts of a job: `-H a:2,b:2` / `--hostfile` parsing, the host-major rank layout, and which
hosts are this machine.

Layout (Horovod's): ranks fill the hosts in the order given, each up to its slots; on each host
local_rank counts from 0 and local_size is the number of ranks placed there; cross_rank is the
index of the host among the hosts that have a rank with this local_rank, and cross_size the
number of such hosts.
"""

import collections
import fcntl
import functools
import socket
import struct

from hvdlite.common.exceptions import InvalidArgumentError

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address

HostSlots = collections.namedtuple("HostSlots", "host slots")
RankSlot = collections.namedtuple("RankSlot", "rank host local_rank local_size cross_rank cross_size")


def parse_hosts(text):
    """ "a:2,b,c:1" -> [HostSlots]; a host without ":N" has 1 slot."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, slots = item.rpartition(":")
        if not sep:
            host, slots = item, "1"
        out.append(_host_slots(host, slots, "-H %s" % text))
    if not out:
        raise InvalidArgumentError("-H %r names no host" % text)
    return out


def parse_hostfile(path):
    """Lines `host slots=N` (or just `host`, 1 slot); blank lines and # comments are skipped."""
    out = []
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            slots = "1"
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "slots":
                    slots = value
            out.append(_host_slots(fields[0], slots, "%s line %d" % (path, number)))
    if not out:
        raise InvalidArgumentError("hostfile %s names no host" % path)
    return out


def _host_slots(host, slots, where):
    try:
        n = int(slots)
    except ValueError:
        n = 0
    if not host or n < 1:
        raise InvalidArgumentError("%s: %r is not host:slots with slots >= 1" % (where, host + ":" + slots))
    return HostSlots(host, n)


def layout(hosts, np):
    """[RankSlot] for np ranks over `hosts` ([HostSlots], order kept), host-major."""
    total = sum(h.slots for h in hosts)
    if np > total:
        raise InvalidArgumentError(
            "-np %d is more than the %d slot(s) of the hosts (%s)"
            % (np, total, ",".join("%s:%d" % h for h in hosts))
        )
    placed = []  # (rank, host index, local_rank)
    rank = 0
    for index, h in enumerate(hosts):
        for local in range(h.slots):
            if rank == np:
                break
            placed.append((rank, index, local))
            rank += 1
    local_size = collections.Counter(index for _, index, _ in placed)
    hosts_with_local = collections.defaultdict(list)  # local_rank -> host indices, in order
    for _, index, local in placed:
        hosts_with_local[local].append(index)
    return [
        RankSlot(
            rank,
            hosts[index].host,
            local,
            local_size[index],
            hosts_with_local[local].index(index),
            len(hosts_with_local[local]),
        )
        for rank, index, local in placed
    ]


@functools.lru_cache(maxsize=1)
def _fqdn():
    """This host's fully qualified name, looked up once (it may ask DNS)."""
    return socket.getfqdn()


def is_local(host):
    """True when `host` is this machine: its name, or an address one of our interfaces owns
    (binding to it succeeds; every 127.x address is loopback). Decided without sending a packet;
    an unresolvable name is remote (ssh will name the problem)."""
    if host == "localhost" or host.startswith("127.") or host == socket.gethostname():
        return True
    if host == _fqdn():
        return True
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for info in infos:
        addr = info[4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr, 0))
                return True
            except OSError:
                continue
    return False


def route_address(host, port=22):
    """The address of our interface that reaches `host` (UDP connect: no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def interface_address(names):
    """IPv4 address of the first interface in `names` (a list) that has one, else None."""
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            return socket.inet_ntoa(packed[20:24])
    return None


LOOPBACK = "127.0.0.1"


def store_address(remote_hosts, network_interfaces=None):
    """Where a launcher's stores listen (multihost.py, elastic_driver.py): loopback when every
    rank is here, else the address of the interface named by --network-interfaces (a comma
    list) or of the one that routes to the first remote host. Raises InvalidArgumentError when
    no named interface has an address, OSError when no route reaches the host."""
    if not remote_hosts:
        return LOOPBACK
    if network_interfaces:
        names = [n.strip() for n in network_interfaces.split(",") if n.strip()]
        addr = interface_address(names)
        if addr is None:
            raise InvalidArgumentError(
                "--network-interfaces %s: none of these interfaces has an IPv4 address on this "
                "host (the launcher's)" % network_interfaces
            )
        return addr
    return route_address(remote_hosts[0])
