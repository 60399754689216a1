"""The job identity of one process as environment variables: the one place that spells them.

Every launcher (hvdliterun's static and multi-host modes, the elastic driver and its workers
re-forming into a new generation) writes them through identity_env(): the HVDLITE_* settings the
core reads (hvdlite/common/settings.py declares them), and the same values under Horovod's
HOROVOD_* names, which Horovod scripts and Horovod's own tests read (HOROVOD_RANK for a start
rank, HOROVOD_HOSTNAME for the host). Standard library only.
"""

RANK_NAMES = ("RANK", "SIZE")
TOPOLOGY_NAMES = ("LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
PREFIXES = ("HVDLITE_", "HOROVOD_")


def identity_env(rank, size, local=None, hostname=None):
    """{variable: value} for the process of `rank` in a job of `size`. local: (local_rank,
    local_size, cross_rank, cross_size), or None to leave them to the core, which computes them
    from the ranks' host identities (then neither name is set). hostname: the host's name as the launcher knows it, exported as
    HOROVOD_HOSTNAME (HVDLITE_HOSTNAME, the core's shared-memory identity, is the launcher's
    separate choice)."""
    values = dict(zip(RANK_NAMES, (rank, size)))
    if local is not None:
        values.update(zip(TOPOLOGY_NAMES, local))
    env = {prefix + name: str(value) for prefix in PREFIXES for name, value in values.items()}
    if hostname is not None:
        env["HOROVOD_HOSTNAME"] = str(hostname)
    return env


def strip_identity(env):
    """Removes every identity variable identity_env() writes (both prefixes, HOROVOD_HOSTNAME)
    from the mapping `env`, in place: a launcher whose ranks learn their identity elsewhere
    (mpirun) must not pass its own process's on."""
    for prefix in PREFIXES:
        for name in RANK_NAMES + TOPOLOGY_NAMES:
            env.pop(prefix + name, None)
    env.pop("HOROVOD_HOSTNAME", None)


def topology_of(hosts):
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
    return [(lr, per_host[host], cr, per_local[lr]) for host, lr, cr in zip(hosts, local_rank, cross_rank)]
