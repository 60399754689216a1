"""horovodrun for hvdlite: Horovod 0.28's launcher flags, translated to hvdliterun.

    horovodrun -np 4 python train.py
    horovodrun -np 4 -H localhost:4 --fusion-threshold-mb 32 --timeline-filename t.json python train.py
    horovodrun --mpi -np 4 -H a:2,b:2 python train.py      # mpirun with -H a:2,b:2

translate() maps the flags to (hvdliterun arguments, environment overrides): the tunables become
the HVDLITE_* settings Horovod's HOROVOD_* variables stand for; hosts, ssh and NIC flags go to
hvdliterun (which starts remote ranks over ssh), or with --mpi the hosts go to mpirun; the
elastic flags (--min-np, --host-discovery-script, ...) go to hvdliterun's elastic driver with -H;
flags for features hvdlite does not have in its launcher (jsrun, a config file) are refused with
a message, and flags without effect here (torus mode, thread affinity,
timestamps) are accepted with a note on stderr. run_commandline() is the console script's entry point.
"""

import argparse
import os
import sys
from collections.abc import Sequence

# Flags accepted for compatibility that change nothing in hvdlite: dest -> whether it takes a value.
_NO_EFFECT = {
    "--binding-args": True,
    "--num-nccl-streams": True,
    "--thread-affinity": True,
    "--gloo-timeout-seconds": True,
    "--autotune-bayes-opt-max-samples": True,
    "--autotune-gaussian-process-noise": True,
    "--tcp": False,
    "--torus-allreduce": False,
    "--no-torus-allreduce": False,
    "--mpi-threads-disable": False,
    "--no-mpi-threads-disable": False,
    "--log-with-timestamp": False,
    "--log-without-timestamp": False,
    "--log-hide-timestamp": False,
    "--no-log-hide-timestamp": False,
    "-prefix-timestamp": False,
    "--prefix-output-with-timestamp": False,
    "--no-autotune": False,
    "--stall-check": False,
    "--no-timeline-mark-cycles": False,
}

# Horovod's elastic flags, passed to hvdliterun's elastic driver as they are:
# (flags, dest, type, nargs).
_ELASTIC = [
    (("--min-np", "--min-num-proc"), "min_np", int, None),
    (("--max-np", "--max-num-proc"), "max_np", int, None),
    (("--slots-per-host",), "slots", int, None),
    (("--elastic-timeout",), "elastic_timeout", int, None),
    (("--reset-limit",), "reset_limit", int, None),
    (("--blacklist-cooldown-range",), "cooldown_range", int, 2),
    (("--host-discovery-script",), "host_discovery_script", str, None),
]

# Horovod features this launcher does not provide: flag -> why.
_REFUSED = {
    "--jsrun": "the jsrun controller",
    "--config-file": "YAML config files",
}


class UsageError(Exception):
    """A horovodrun command line hvdlite cannot run; the message says why and what to do."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="horovodrun",
        description="Horovod's launcher, provided by hvdlite: runs COMMAND on N ranks through hvdliterun.",
    )
    p.add_argument("-v", "--version", action="store_true")
    p.add_argument("-np", "--num-proc", dest="np", type=int)
    p.add_argument("-cb", "--check-build", action="store_true")
    p.add_argument("--disable-cache", action="store_true")
    p.add_argument("--start-timeout", type=int)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--fusion-threshold-mb", type=int)
    p.add_argument("--cycle-time-ms", type=float)
    p.add_argument("--cache-capacity", type=int)
    p.add_argument("--autotune", action="store_true")
    p.add_argument("--autotune-log-file")
    p.add_argument("--autotune-warmup-samples", type=int)
    p.add_argument("--autotune-steps-per-sample", type=int)
    p.add_argument("--timeline-filename")
    p.add_argument("--timeline-mark-cycles", action="store_true")
    p.add_argument("--no-stall-check", action="store_true")
    p.add_argument("--stall-check-warning-time-seconds", type=int)
    p.add_argument("--stall-check-shutdown-time-seconds", type=int)
    p.add_argument("--log-level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"])
    p.add_argument("-H", "--hosts")
    p.add_argument("-hostfile", "--hostfile")
    p.add_argument("-p", "--ssh-port", type=int)
    p.add_argument("-i", "--ssh-identity-file")
    p.add_argument("--network-interfaces", "--network-interface", dest="network_interfaces")
    p.add_argument("--output-filename")
    for op in ("allreduce", "allgather"):  # on / off; neither: hvdlite's default (two levels from 1 MiB)
        p.add_argument("--hierarchical-" + op, dest="hierarchical_" + op, action="store_const", const=1)
        p.add_argument("--no-hierarchical-" + op, dest="hierarchical_" + op, action="store_const", const=0)
    p.add_argument("--gloo", action="store_true")
    p.add_argument("--mpi", action="store_true")
    p.add_argument("--mpi-args", default="")
    for flag, takes_value in _NO_EFFECT.items():
        p.add_argument(
            flag,
            dest="ignored_" + flag.lstrip("-").replace("-", "_"),
            action="append" if takes_value else "count",
        )
    for flags, dest, kind, nargs in _ELASTIC:
        p.add_argument(*flags, dest=dest, type=kind, nargs=nargs)
    for flag in _REFUSED:
        p.add_argument(flag, dest="refused_" + flag.lstrip("-").replace("-", "_"), nargs="?", const=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _parse_hosts(hosts: str | None, hostfile: str | None) -> list[tuple[str, int]]:
    """[(host, slots)] from Horovod's -H `a:2,b:2` or a hostfile of `host slots=N` lines."""
    out = []
    if hosts:
        for item in hosts.split(","):
            name, _, slots = item.strip().partition(":")
            out.append((name, int(slots) if slots else 1))
    if hostfile:
        with open(hostfile) as f:
            for line in f:
                fields = line.split("#", 1)[0].split()
                if not fields:
                    continue
                count = 1
                for field in fields[1:]:
                    if field.startswith("slots="):
                        count = int(field.split("=", 1)[1])
                out.append((fields[0], count))
    return out


def translate(argv: Sequence[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """(hvdliterun arguments, environment overrides, notes for stderr) for a horovodrun command
    line; raises UsageError for one hvdlite cannot run."""
    args = _parser().parse_args(list(argv))
    for flag in _REFUSED:
        if getattr(args, "refused_" + flag.lstrip("-").replace("-", "_")) is not None:
            raise UsageError(
                "horovodrun %s: hvdlite's launcher has no %s; run a fixed number of ranks with -np N"
                % (flag, _REFUSED[flag])
            )
    notes = [
        "horovodrun: %s has no effect with hvdlite, ignored" % flag
        for flag in _NO_EFFECT
        if getattr(args, "ignored_" + flag.lstrip("-").replace("-", "_"))
    ]
    if args.gloo and args.mpi:
        raise UsageError("horovodrun: --gloo and --mpi exclude each other")
    run_args: list[str] = []
    env: dict[str, str] = {}
    if args.version:
        return ["--version"], env, notes
    if args.check_build:
        return ["--check-build"], env, notes
    if args.np is not None:
        run_args += ["-np", str(args.np)]

    hosts = _parse_hosts(args.hosts, args.hostfile)
    elastic = [flags[0] for flags, dest, _, _ in _ELASTIC if getattr(args, dest) is not None]
    if elastic:
        return _translate_elastic(args, run_args, hosts, notes)
    mpi_args = args.mpi_args
    if hosts and args.np is not None and args.np > sum(s for _, s in hosts):
        raise UsageError(
            "horovodrun: -np %d is more than the %d slots the hosts offer"
            % (args.np, sum(s for _, s in hosts))
        )
    if args.mpi:
        run_args.append("--mpi")
        if args.hostfile:
            mpi_args = ("--hostfile %s %s" % (args.hostfile, mpi_args)).strip()
        elif args.hosts:
            mpi_args = ("-H %s %s" % (",".join("%s:%d" % hs for hs in hosts), mpi_args)).strip()
        if mpi_args:
            run_args += ["--mpi-args", mpi_args]
    else:
        if args.hostfile:
            run_args += ["--hostfile", args.hostfile]
        elif args.hosts:
            run_args += ["-H", ",".join("%s:%d" % hs for hs in hosts)]
        for flag, value in (
            ("--ssh-port", args.ssh_port),
            ("--ssh-identity-file", args.ssh_identity_file),
            ("--network-interfaces", args.network_interfaces),
            ("--output-filename", args.output_filename),
        ):
            if value is not None:
                run_args += [flag, str(value)]
        if args.mpi_args:
            notes.append("horovodrun: --mpi-args has no effect without --mpi, ignored")
    if args.verbose:
        run_args.append("--verbose")
    if args.timeline_filename:
        run_args += ["--timeline-filename", args.timeline_filename]

    settings = {
        "START_TIMEOUT": args.start_timeout,
        "FUSION_THRESHOLD": None
        if args.fusion_threshold_mb is None
        else args.fusion_threshold_mb * 1024 * 1024,
        "CYCLE_TIME": args.cycle_time_ms,
        "CACHE_CAPACITY": 0 if args.disable_cache else args.cache_capacity,
        "AUTOTUNE": 1 if args.autotune else None,
        "AUTOTUNE_LOG": args.autotune_log_file,
        "AUTOTUNE_WARMUP_SAMPLES": args.autotune_warmup_samples,
        "AUTOTUNE_STEPS_PER_SAMPLE": args.autotune_steps_per_sample,
        "TIMELINE_MARK_CYCLES": 1 if args.timeline_mark_cycles else None,
        "STALL_CHECK_DISABLE": 1 if args.no_stall_check else None,
        "STALL_CHECK_TIME_SECONDS": args.stall_check_warning_time_seconds,
        "STALL_SHUTDOWN_TIME_SECONDS": args.stall_check_shutdown_time_seconds,
        "LOG_LEVEL": args.log_level.lower() if args.log_level else None,
        "HIERARCHICAL_ALLREDUCE": args.hierarchical_allreduce,
        "HIERARCHICAL_ALLGATHER": args.hierarchical_allgather,
    }
    env.update({"HVDLITE_" + k: str(v) for k, v in settings.items() if v is not None})
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return run_args + command, env, notes


def _translate_elastic(
    args: argparse.Namespace, run_args: list[str], hosts: list[tuple[str, int]], notes: list[str]
) -> tuple[list[str], dict[str, str], list[str]]:
    """Elastic mode: hvdliterun's elastic driver takes Horovod's flags, -H and the ssh and NIC
    flags as they are (it starts workers on remote hosts over ssh, like the multi-host launcher)."""
    if args.mpi:
        raise UsageError(
            "horovodrun: elastic training runs under hvdliterun's driver, not mpirun; drop --mpi"
        )
    for flags, dest, _, _ in _ELASTIC:
        value = getattr(args, dest)
        if value is not None:
            run_args += [flags[0]] + [str(v) for v in (value if isinstance(value, list) else [value])]
    if hosts:
        run_args += ["-H", ",".join("%s:%d" % hs for hs in hosts)]
    for flag, value in (
        ("--ssh-port", args.ssh_port),
        ("--ssh-identity-file", args.ssh_identity_file),
        ("--network-interfaces", args.network_interfaces),
    ):
        if value is not None:
            run_args += [flag, str(value)]
    if args.verbose:
        run_args.append("--verbose")
    env = {"HVDLITE_START_TIMEOUT": str(args.start_timeout)} if args.start_timeout else {}
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return run_args + command, env, notes


def run_commandline(argv: Sequence[str] | None = None) -> int:
    """The `horovodrun` console script: translates, then runs hvdliterun in this process and
    returns its exit code (the failing rank's code when a rank fails)."""
    try:
        run_args, env, notes = translate(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    if run_args == ["--version"]:
        from horovod import __version__

        print(__version__)
        return 0
    from hvdlite.runner import launch

    os.environ.update(env)
    return int(launch.main(run_args) or 0)


def main() -> None:
    sys.exit(run_commandline())


if __name__ == "__main__":
    main()
