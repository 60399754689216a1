"""The job description of one process, and the one table of the variables that carry it.

Every launcher ends in the same description (rank, size, local and cross topology, the store's
address and the secret): hvdliterun and its elastic driver write it into each rank's environment,
the elastic worker into its own when it joins a new generation, and hvd.init() into its own when
another launcher (torchrun, Slurm's srun: hvdlite.common.launchers) started it. They all write it
through write() below, so each variable name is spelled once, in IDENTITY.

This module imports nothing outside the standard library.
"""

import hashlib
import hmac
from typing import Any, NamedTuple


# The job description. None means "not given": the core computes local and cross topology from
# the host names the ranks exchange, and hostname defaults to this host's identity.
class Job(NamedTuple):
    rank: int | None = None
    size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int | None = None
    cross_size: int | None = None
    store_addr: str | None = None
    secret: str | None = None  # hex
    hostname: str | None = None


# field -> the variables that carry it, HVDLITE_* first (the core reads HVDLITE_<name> and falls
# back to HOROVOD_<name>, so a stale HOROVOD_* copy would win over an unset HVDLITE_* one: write()
# always writes or clears every name of a row). HOROVOD_* are the names Horovod's launcher exports
# and that scripts and Horovod's tests read (test_horovod_rank compares hvd.rank() with them).
IDENTITY = (
    ("rank", ("HVDLITE_RANK", "HOROVOD_RANK")),
    ("size", ("HVDLITE_SIZE", "HOROVOD_SIZE")),
    ("local_rank", ("HVDLITE_LOCAL_RANK", "HOROVOD_LOCAL_RANK")),
    ("local_size", ("HVDLITE_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE")),
    ("cross_rank", ("HVDLITE_CROSS_RANK", "HOROVOD_CROSS_RANK")),
    ("cross_size", ("HVDLITE_CROSS_SIZE", "HOROVOD_CROSS_SIZE")),
    ("store_addr", ("HVDLITE_STORE_ADDR", "HOROVOD_STORE_ADDR")),
    ("secret", ("HVDLITE_SECRET", "HOROVOD_SECRET")),
    ("hostname", ("HVDLITE_HOSTNAME", "HOROVOD_HOSTNAME")),
)
# Rows a write() leaves alone when the job does not give them (a user's own HVDLITE_HOSTNAME).
_KEPT_WHEN_UNSET = frozenset(["hostname"])
# The variables Horovod's launcher does not export: kept out of a rank's environment unless they
# carry a value of their own (HOROVOD_STORE_ADDR and HOROVOD_SECRET are only read as fallbacks).
_WRITTEN_ONLY_AS_FALLBACK = frozenset(["HOROVOD_STORE_ADDR", "HOROVOD_SECRET"])


def names(field=None):
    """Every identity variable, or those of one field."""
    return [n for f, row in IDENTITY if field in (None, f) for n in row]


def write(env, job):
    """Writes `job` into the mapping `env` (os.environ or a rank's environment dict): each field
    that is set goes into the names of its row; each that is None is removed (except hostname,
    which is kept when the job does not give one). Returns env."""
    for field, row in IDENTITY:
        value = getattr(job, field)
        for name in row:
            if value is None or name in _WRITTEN_ONLY_AS_FALLBACK:
                if field not in _KEPT_WHEN_UNSET:
                    env.pop(name, None)
            else:
                env[name] = str(value)
    return env


def clear(env):
    """Removes every identity variable from `env` but a given host name (mpirun's ranks take
    theirs from MPI)."""
    return write(env, Job())


def read(env):
    """The job `env` describes through the identity variables (HVDLITE_* before HOROVOD_*), or
    None when it sets no rank."""
    values: dict[str, Any] = {}
    for field, row in IDENTITY:
        text = next((env[n] for n in row if env.get(n, "") != ""), None)
        if text is not None:
            values[field] = text if field in ("store_addr", "secret", "hostname") else int(text)
    return Job(**values) if "rank" in values else None


def generation_job(record, worker_id):
    """The job of elastic worker `worker_id` in generation `record` (the protocol of
    hvdlite/elastic/worker.py): rank, size, local and cross topology (the driver computes them
    with topology(), the core's rule, so Horovod's HOROVOD_LOCAL_RANK is set as in static mode;
    a record without them leaves them to the core), host name, the generation's store and
    secret."""
    me = record["workers"][worker_id]
    local_rank, local_size, cross_rank, cross_size = me.get("local") or (None, None, None, None)
    return Job(
        me["rank"],
        me["size"],
        local_rank,
        local_size,
        cross_rank,
        cross_size,
        store_addr=record["store_addr"],
        secret=record["secret"],
        hostname=me["hostname"],
    )


def topology(hosts):
    """[(local_rank, local_size, cross_rank, cross_size)] per rank, for the ranks' host names in
    rank order: the rule the core applies (csrc/runtime/bootstrap.cc ComputeTopology): local
    ranks count a host's ranks in rank order, cross ranks count the ranks of one local rank."""
    local_rank: list[int] = []
    per_host: dict[str, int] = {}
    for host in hosts:
        local_rank.append(per_host.get(host, 0))
        per_host[host] = local_rank[-1] + 1
    cross_rank: list[int] = []
    per_local: dict[int, int] = {}
    for lr in local_rank:
        cross_rank.append(per_local.get(lr, 0))
        per_local[lr] = cross_rank[-1] + 1
    return [(lr, per_host[h], cr, per_local[lr]) for h, lr, cr in zip(hosts, local_rank, cross_rank)]


def shm_tag(secret):
    """ "hvdlite-" and 16 hex digits of HMAC-SHA256(secret, "hvdlite-shm-segment"): how every
    /dev/shm name of the job with `secret` (bytes) begins, so the launcher removes what a killed
    rank left behind and never another job's (the core derives it too: csrc/transport/shm_setup.cc)."""
    return "hvdlite-" + hmac.new(secret, b"hvdlite-shm-segment", hashlib.sha256).hexdigest()[:16]
