"""hvdliterun: runs N ranks of a command on this host, Horovod's `horovodrun` for hvdlite.

    hvdliterun -np 4 python train.py [args...]
    hvdliterun --mpi -np 4 python train.py [args...]     # started by mpirun instead
    hvdliterun --check-build

It generates a per-job secret, hosts the TCP rendezvous store in this process (it admits only
clients proving the secret), starts the ranks with the HVDLITE_* identity variables, prefixes
their output with the rank, and stops the whole job as soon as one rank fails (see job.py).
Any other launcher works too if it sets the same variables (rank_env() lists them).
"""

import argparse
import hashlib
import hmac
import os
import sys

SECRET_BYTES = 32
STORE_HOST = "127.0.0.1"  # one host only for now: the store listens on loopback


def rank_env(base, rank, size, store_addr, secret_hex, verbose=False, timeline=None):
    """The environment of one rank: `base` plus the variables every launcher must set."""
    env = dict(base)
    env.update(
        {
            "HVDLITE_RANK": str(rank),
            "HVDLITE_SIZE": str(size),
            "HVDLITE_LOCAL_RANK": str(rank),  # one host: local == global
            "HVDLITE_LOCAL_SIZE": str(size),
            "HVDLITE_CROSS_RANK": "0",
            "HVDLITE_CROSS_SIZE": "1",
            "HVDLITE_STORE_ADDR": store_addr,
            "HVDLITE_SECRET": secret_hex,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if verbose:
        env["HVDLITE_LOG_LEVEL"] = "debug"
    if timeline:
        env["HVDLITE_TIMELINE"] = os.path.abspath(timeline)
    return env


def _join_mpi_args(argv):
    """`--mpi-args "-H a:2"` -> `--mpi-args=-H a:2` (the first occurrence only): argparse would
    take a value starting with a known short option (-H) for that option. Were the first one in
    the command, the command gets the equivalent `--mpi-args=VALUE`."""
    argv = list(argv)
    if "--mpi-args" in argv[:-1]:
        i = argv.index("--mpi-args")
        argv[i : i + 2] = ["--mpi-args=" + argv[i + 1]]
    return argv


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="hvdliterun",
        description="Run N ranks of COMMAND on this host as one hvdlite job.",
        epilog="Only this host for now: every rank runs locally (-H names local 'hosts' in elastic mode). "
        "Each output line is prefixed with [rank]<stdout>: or [rank]<stderr>:. "
        "The job stops as soon as one rank exits non-zero, and hvdliterun exits "
        "with that rank's code.",
    )
    parser.add_argument(
        "-np", "--num-proc", dest="np", type=int, metavar="N", help="number of ranks to start"
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
    args = parser.parse_args(_join_mpi_args(argv))
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


def start_store(secret, num_ranks=0):
    """Starts the rendezvous store on an ephemeral loopback port; returns the server. With
    num_ranks > 0 it first checks that the open-file limit holds that many clients."""
    try:
        from hvdlite import _core
    except ImportError as e:
        sys.exit(
            "hvdliterun: the hvdlite core (hvdlite._core) cannot be imported (%s); "
            "build it with `make install`" % e
        )
    return _core.TcpStoreServer(STORE_HOST, 0, secret, clients=num_ranks)


def remove_shm_leftovers(secret):
    """Unlinks this job's shared-memory segments that a rank killed in the middle of init()
    may have left in /dev/shm. Normally there are none: each rank unlinks its segment as
    soon as its peers have mapped it. Names start with a tag derived from the job secret
    (csrc/transport/shm_setup.cc), so other jobs' segments are never touched."""
    tag = "hvdlite-%s-" % hmac.new(secret, b"hvdlite-shm-segment", hashlib.sha256).hexdigest()[:16]
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
        return elastic_cli.run_elastic(args)
    if getattr(args, "hosts", None):  # until multi-host launching lands (issue 10)
        sys.exit("hvdliterun: -H is only taken with --min-np/--max-np (elastic mode) for now")

    from hvdlite.runner.job import LocalJob

    secret = os.urandom(SECRET_BYTES)
    server = start_store(secret, args.np)
    try:
        store_addr = "%s:%d" % (STORE_HOST, server.port)
        envs = [
            rank_env(os.environ, r, args.np, store_addr, secret.hex(), args.verbose, args.timeline_filename)
            for r in range(args.np)
        ]
        if args.verbose:
            print(
                "hvdliterun: %d rank(s) of %s; store at %s" % (args.np, " ".join(args.command), store_addr),
                file=sys.stderr,
                flush=True,
            )
        return LocalJob(args.command, envs).run()
    finally:
        server.stop()
        remove_shm_leftovers(secret)


if __name__ == "__main__":
    sys.exit(main())
