"""hvdliterun's elastic flags (Horovod's names) and the entry into the elastic driver.

Elastic mode is on when --host-discovery-script, --min-np, --max-np or --srun is given. Hosts come from
the discovery script, or from -H host[:slots],... (fault tolerance without discovery).
"""

import os
import sys

from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.runner import elastic_discovery, elastic_srun, remote
from hvdlite.runner.elastic_driver import ElasticDriver

DEFAULT_ELASTIC_TIMEOUT_S = 600.0
SSH_CONNECT_TIMEOUT_S = 10.0  # an unreachable host's worker fails (and its host is blacklisted) after this


def _add(parser, *names, **kwargs):
    """Adds the option unless another part of the launcher declared it already (-H is shared
    with the multi-host launcher)."""
    if any(n in parser._option_string_actions for n in names):
        return
    parser.add_argument(*names, **kwargs)


def add_elastic_args(parser):
    group = parser.add_argument_group("elastic arguments")
    _add(
        group,
        "-H",
        "--hosts",
        dest="hosts",
        metavar="HOST[:SLOTS],...",
        help="hosts and their slots, e.g. localhost:2,127.0.0.2:2 (with --min-np: fault tolerance without discovery)",
    )
    _add(
        group,
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=int,
        metavar="N",
        help="elastic: fewest ranks training may continue with (default: -np)",
    )
    _add(
        group,
        "--max-np",
        "--max-num-proc",
        dest="max_np",
        type=int,
        metavar="N",
        help="elastic: most ranks ever started (default: every discovered slot)",
    )
    _add(
        group,
        "--host-discovery-script",
        dest="host_discovery_script",
        metavar="SCRIPT",
        help="elastic: executable printing the available hosts, one host[:slots] per line; run every second",
    )
    _add(
        group,
        "--slots-per-host",
        dest="slots_per_host",
        type=int,
        metavar="N",
        help="elastic: slots of a discovered host that prints no :slots (default 1)",
    )
    _add(
        group,
        "--elastic-timeout",
        dest="elastic_timeout",
        type=float,
        metavar="SECONDS",
        help="elastic: how long to wait for --min-np slots before ending the job "
        "(default: HOROVOD_ELASTIC_TIMEOUT, else 600)",
    )
    _add(
        group,
        "--reset-limit",
        dest="reset_limit",
        type=int,
        metavar="N",
        help="elastic: end the job after this many re-formations (default: no limit)",
    )
    _add(
        group,
        "--blacklist-cooldown-range",
        dest="cooldown_range",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="elastic: seconds a host whose worker failed stays blacklisted (exponential back-off "
        "between MIN and MAX); default: for good",
    )

    _add(
        group,
        "--srun",
        dest="srun",
        action="store_true",
        help="elastic under Slurm: start each worker as a one-task srun step on its node (hosts: "
        "-H, the discovery script, else the allocation's nodes); see docs/launchers.md",
    )


def is_elastic(args):
    return bool(args.host_discovery_script or args.min_np is not None or args.max_np is not None or args.srun)


def _ssh_options(args):
    """ssh settings for workers on remote hosts: the multi-host launcher's flags."""
    timeout = getattr(args, "start_timeout", None)
    return remote.SshOptions(
        getattr(args, "ssh_port", None),
        getattr(args, "ssh_identity_file", None),
        min(timeout, SSH_CONNECT_TIMEOUT_S) if timeout else SSH_CONNECT_TIMEOUT_S,
    )


def run_elastic(args):
    """Runs the job elastically; returns hvdliterun's exit status."""
    np = args.np
    min_np = args.min_np if args.min_np is not None else np
    max_np = args.max_np
    if min_np < 1 or min_np > np or (max_np is not None and max_np < np):
        sys.exit(
            "hvdliterun: want 1 <= --min-np <= -np <= --max-np, got %s <= %s <= %s" % (min_np, np, max_np)
        )
    discovery: elastic_discovery.DiscoveryScript | elastic_discovery.FixedHosts | elastic_srun.AllocationHosts
    try:
        if args.host_discovery_script:
            discovery = elastic_discovery.DiscoveryScript(args.host_discovery_script, args.slots_per_host)
        elif args.srun and not getattr(args, "hosts", None):
            discovery = elastic_srun.AllocationHosts()
        else:
            hosts_text = getattr(args, "hosts", None) or "localhost:%d" % (max_np or np)
            discovery = elastic_discovery.FixedHosts(
                elastic_discovery.parse_hosts(hosts_text, args.slots_per_host or 1)
            )
        manager = elastic_discovery.HostManager(discovery, args.cooldown_range)
    except InvalidArgumentError as e:  # launchers.LauncherEnvError (AllocationHosts) is one
        sys.exit("hvdliterun: %s" % e)
    timeout = args.elastic_timeout
    if timeout is None:
        timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", DEFAULT_ELASTIC_TIMEOUT_S))
    driver = (elastic_srun.SrunElasticDriver if args.srun else ElasticDriver)(
        args.command,
        np,
        min_np,
        max_np,
        manager,
        elastic_timeout=timeout,
        reset_limit=args.reset_limit,
        verbose=args.verbose,
        ssh_options=_ssh_options(args),
        network_interfaces=getattr(args, "network_interfaces", None),
    )
    try:
        return driver.run()
    except elastic_discovery.DiscoveryError as e:
        sys.exit("hvdliterun: %s" % e)
