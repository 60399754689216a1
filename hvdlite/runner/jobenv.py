"""What every hvdliterun job needs, local or over hosts: the rank environment (the whole
contract with a rank), the rendezvous store, the job secret, and cleaning up after a job.
"""

import os
import sys

from hvdlite.common import job as jobs

SECRET_BYTES = 32
STORE_HOST = "127.0.0.1"  # every rank on this machine: the store listens on loopback


def rank_env(base, rank, size, store_addr, secret_hex, verbose=False, timeline=None, slot=None):
    """The environment of one rank: `base` plus the variables every launcher must set. slot: its
    hosts.RankSlot (local/cross rank and size); None means one host (local == global)."""
    env = dict(base)
    local = (rank, size, 0, 1) if slot is None else slot[2:6]
    jobs.write(env, jobs.Job(rank, size, local[0], local[1], local[2], local[3], store_addr, secret_hex))
    env["PYTHONUNBUFFERED"] = "1"
    if verbose:
        env["HVDLITE_LOG_LEVEL"] = "debug"
    if timeline:
        env["HVDLITE_TIMELINE"] = os.path.abspath(timeline)
    return env


def start_store(secret, num_ranks=0, host=STORE_HOST):
    """Starts the rendezvous store on an ephemeral port of `host`; returns the server. With
    num_ranks > 0 it first checks that the open-file limit holds that many clients."""
    try:
        from hvdlite.common.native import core as _core
    except ImportError as e:
        sys.exit(
            "hvdliterun: the hvdlite core (hvdlite._core) cannot be imported (%s); "
            "build it with `make install`" % e
        )
    return _core.TcpStoreServer(host, 0, secret, clients=num_ranks)


def remove_shm_leftovers(secret):
    """Unlinks this job's shared-memory segments that a rank killed in the middle of init()
    may have left in /dev/shm. Normally there are none: each rank unlinks its segment as
    soon as its peers have mapped it. Names start with a tag derived from the job secret
    (csrc/transport/shm_setup.cc), so other jobs' segments are never touched."""
    tag = jobs.shm_tag(secret) + "-"
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if name.startswith(tag):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def job_base_env(args):
    """Our environment plus what the flags set in every rank."""
    env = dict(os.environ)
    if args.start_timeout is not None:
        env["HVDLITE_START_TIMEOUT"] = str(args.start_timeout)
    if args.network_interfaces:
        env["HVDLITE_NETWORK_INTERFACES"] = args.network_interfaces
    return env
