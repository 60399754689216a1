"""hvdliterun: runs N ranks of a command on this host or on several, Horovod's `horovodrun`.

    hvdliterun -np 4 python train.py [args...]
    hvdliterun -np 8 -H hostA:4,hostB:4 python train.py [args...]   # ranks 0-3 on hostA
    hvdliterun -np 8 --hostfile hosts.txt python train.py            # lines `host slots=N`
    hvdliterun --mpi -np 4 python train.py [args...]     # started by mpirun instead
    hvdliterun --check-build

It generates a per-job secret, hosts the TCP rendezvous store in this process (it admits only
clients proving the secret), starts the ranks with the HVDLITE_* identity variables, prefixes
their output with the rank, and stops the whole job as soon as one rank fails (see job.py).
Any other launcher works too if it sets the same variables (rank_env() lists them).

With hosts, ranks are laid out host-major (hosts.py). Hosts that are this machine (by name or
by an address it owns) are started directly, every other one over ssh (remote.py), after
every remote host has answered an ssh `true`. The store then listens on the address that
reaches the hosts (or --network-interfaces'), never on all interfaces.
"""

import argparse
import os
import sys

from hvdlite.runner.jobenv import (
    SECRET_BYTES,
    STORE_HOST,
    job_base_env,
    rank_env,
    remove_shm_leftovers,
    start_store,
)


def _join_mpi_args(argv):
    """`--mpi-args "-H a:2"` -> `--mpi-args=-H a:2`: argparse would read a value that starts
    with one of our own short options (-H, -p, -i) as that option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] == "--mpi-args" and i + 1 < len(argv):
            out.append("--mpi-args=" + argv[i + 1])
            i += 2
            continue
        if not argv[i].startswith("-") and out and not out[-1].startswith("-"):
            return out + argv[i:]  # the command has begun: its own flags are not ours
        out.append(argv[i])
        i += 1
    return out


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="hvdliterun",
        description="Run N ranks of COMMAND as one hvdlite job, on this host or on the hosts given.",
        epilog="Without -H/--hostfile every rank runs on this host. Remote hosts are reached with "
        "plain ssh (BatchMode: set up keys first); with --min-np/--max-np/--host-discovery-script "
        "the job is elastic (hosts from -H or the discovery script). "
        "Each output line is prefixed with [rank]<stdout>: or [rank]<stderr>:. "
        "The job stops as soon as one rank exits non-zero, and hvdliterun exits "
        "with that rank's code.",
    )
    parser.add_argument(
        "-np", "--num-proc", dest="np", type=int, metavar="N", help="number of ranks to start"
    )
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...", help="hosts and their slots, e.g. a:4,b:4")
    hosts.add_argument("--hostfile", metavar="FILE", help="a file of lines `host slots=N`")
    parser.add_argument("-p", "--ssh-port", type=int, metavar="PORT", help="ssh port of the remote hosts")
    parser.add_argument(
        "-i", "--ssh-identity-file", metavar="FILE", help="ssh private key for the remote hosts"
    )
    parser.add_argument(
        "--network-interfaces",
        metavar="IF,...",
        help="interfaces to use, in order of preference; each rank listens on the first one its "
        "host has (default: the interface that reaches this launcher)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        metavar="S",
        help="seconds for hosts to answer and ranks to reach init() (HVDLITE_START_TIMEOUT)",
    )
    parser.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<r>/stdout and DIR/rank.<r>/stderr",
    )
    parser.add_argument(
        "--mpi",
        action="store_true",
        help="start the ranks with mpirun (--oversubscribe --bind-to none); they form the job through MPI",
    )
    parser.add_argument(
        "--mpi-args",
        default="",
        metavar="ARGS",
        help="with --mpi: extra mpirun arguments, e.g. \"-H a:2,b:2\"",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also set HVDLITE_LOG_LEVEL=debug in every rank"
    )
    parser.add_argument(
        "--timeline-filename",
        metavar="FILE",
        help="write a Chrome trace of every tensor to FILE (sets HVDLITE_TIMELINE; rank 0 writes it)",
    )
    parser.add_argument(
        "--check-build",
        action="store_true",
        help="list the frameworks and backends this installation supports, then exit",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND ...",
        help="the program every rank runs, with its arguments",
    )
    from hvdlite.runner.elastic_cli import add_elastic_args

    add_elastic_args(parser)
    args = parser.parse_args(_join_mpi_args(list(argv)))
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.check_build:
        if args.np is None:
            parser.error("-np N is required")
        if args.np < 1:
            parser.error("-np must be at least 1, got %d" % args.np)
        if not args.command:
            parser.error("no COMMAND given")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.check_build:
        from hvdlite.runner.check_build import build_report

        try:
            print(build_report(), flush=True)
        except BrokenPipeError:  # `hvdliterun --check-build | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

    if args.mpi:
        from hvdlite.runner import mpi_launch

        return mpi_launch.run(args.np, args.command, args.mpi_args, args.verbose)

    from hvdlite.runner import elastic_cli

    if elastic_cli.is_elastic(args):
        if args.hostfile:
            sys.exit(
                "hvdliterun: elastic mode takes its hosts from -H or --host-discovery-script, not --hostfile"
            )
        return elastic_cli.run_elastic(args)
    if args.hosts or args.hostfile:
        from hvdlite.runner import multihost

        return multihost.run(args)

    from hvdlite.runner.job import LocalJob

    secret = os.urandom(SECRET_BYTES)
    server = start_store(secret, args.np)
    try:
        store_addr = "%s:%d" % (STORE_HOST, server.port)
        base = job_base_env(args)
        envs = [
            rank_env(base, r, args.np, store_addr, secret.hex(), args.verbose, args.timeline_filename)
            for r in range(args.np)
        ]
        if args.verbose:
            print(
                "hvdliterun: %d rank(s) of %s; store at %s" % (args.np, " ".join(args.command), store_addr),
                file=sys.stderr,
                flush=True,
            )
        return LocalJob(args.command, envs, output_dir=args.output_filename).run()
    finally:
        server.stop()
        remove_shm_leftovers(secret)


if __name__ == "__main__":
    sys.exit(main())
