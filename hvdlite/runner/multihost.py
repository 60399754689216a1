"""hvdliterun -H / --hostfile: one job over several hosts (called by launch.main).

Order of events, each bounded: parse the hosts and lay the ranks out (hosts.py); check every
remote host answers ssh (remote.check_hosts, at most min(start timeout, MAX_CONNECT_S) +
a few seconds, naming every host that did not); start the store on the address that reaches
the remote hosts; start every rank (local ones directly, remote ones over ssh with the secret
on stdin) under one LocalJob, which stops the whole job when any rank, or any ssh connection,
fails. Returns the exit code hvdliterun exits with.
"""

import os
import sys

from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.runner import hosts as hostlib
from hvdlite.runner import remote
from hvdlite.runner.job import LocalJob
from hvdlite.runner.jobenv import (
    SECRET_BYTES,
    job_base_env,
    rank_env,
    remove_shm_leftovers,
    start_store,
)

MAX_CONNECT_S = 10.0
DEFAULT_START_TIMEOUT_S = 30.0  # Horovod's --start-timeout default


def _say(msg):
    print("hvdliterun: %s" % msg, file=sys.stderr, flush=True)


def _layout(args):
    host_list = hostlib.parse_hosts(args.hosts) if args.hosts else hostlib.parse_hostfile(args.hostfile)
    slots = hostlib.layout(host_list, args.np)
    names = []
    for slot in slots:
        if slot.host not in names:
            names.append(slot.host)
    return slots, names


def run(args):
    try:
        slots, names = _layout(args)
    except (InvalidArgumentError, OSError) as e:
        _say(str(e))
        return 2
    local = {h: hostlib.is_local(h) for h in names}
    remote_hosts = [h for h in names if not local[h]]
    start_timeout = args.start_timeout if args.start_timeout is not None else DEFAULT_START_TIMEOUT_S
    options = remote.SshOptions(args.ssh_port, args.ssh_identity_file, min(start_timeout, MAX_CONNECT_S))
    if args.verbose:
        for slot in slots:
            _say(
                "rank %d on %s (%s): local_rank %d/%d, cross_rank %d/%d"
                % (slot.rank, slot.host, "local" if local[slot.host] else "ssh", *slot[2:6])
            )
    if remote_hosts:
        failures = remote.check_hosts(remote_hosts, options)
        if failures:
            for host in remote_hosts:
                if host in failures:
                    _say("host %s is not reachable over ssh: %s" % (host, failures[host]))
            return 1
    try:
        listen = hostlib.store_address(remote_hosts, args.network_interfaces)
    except (InvalidArgumentError, OSError) as e:
        _say(str(e))
        return 2

    secret = os.urandom(SECRET_BYTES)
    server = start_store(secret, args.np, host=listen)
    try:
        store_addr = "%s:%d" % (listen, server.port)
        base = job_base_env(args)
        base.setdefault("HVDLITE_START_TIMEOUT", str(start_timeout))
        envs: list[dict[str, str]] = []
        argvs: list[list[str]] = []
        stdin_data: list[bytes | None] = []
        for slot in slots:
            env = rank_env(
                base, slot.rank, args.np, store_addr, secret.hex(), args.verbose, args.timeline_filename, slot
            )
            argv, popen_env, data = remote.rank_launch(
                slot.host, args.command, env, options, local[slot.host]
            )
            argvs.append(argv)
            envs.append(popen_env)
            stdin_data.append(data)
        if args.verbose:
            _say("store at %s; %d rank(s) on %d host(s)" % (store_addr, args.np, len(names)))
        job = LocalJob(
            args.command,
            envs,
            argvs=argvs,
            stdin_data=stdin_data,
            output_dir=args.output_filename,
            hosts=[(slot.host, not local[slot.host]) for slot in slots],
        )
        return job.run()
    finally:
        server.stop()
        remove_shm_leftovers(secret)
