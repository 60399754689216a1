"""The compute job of hvdlite.tensorflow.data: every rank runs tf.data service servers until the
compute service shuts down (Horovod's horovod.tensorflow.data.compute_worker).

    hvdliterun -np 4 python -m hvdlite.tensorflow.data.compute_worker /shared/compute.json \\
        [--dispatchers 1] [--dispatcher-side compute|training] [--timeout 60]

Rank 0 hosts the compute service (hvdlite/runner/compute_service.py) and writes its config to
CONFIGFILE, which the training job reads (TfDataServiceConfig.read). Blocks until a client calls
shutdown() on the service (TfDataServiceConfig.compute_client().shutdown()).
"""

import argparse
import os

from hvdlite.common import basics
from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.common.objects import broadcast_object
from hvdlite.runner.compute_service import ComputeService
from hvdlite.tensorflow.data.compute_service import TfDataServiceConfig, compute_worker_fn


def main(dispatchers: int, dispatcher_side: str, configfile: str, timeout: int) -> None:
    """Runs this rank of the compute job (see the module); collective over the global set."""
    basics.init()
    size = basics.size()
    if dispatchers <= 0 or size % dispatchers:
        raise InvalidArgumentError(
            f"Number of processes ({size}) must be a multiple of number of dispatchers ({dispatchers})."
        )
    service, config = None, None
    try:
        if basics.rank() == 0:
            key = os.urandom(32)
            service = ComputeService(dispatchers, size // dispatchers, key=key)
            config = TfDataServiceConfig(
                dispatchers=dispatchers,
                workers_per_dispatcher=size // dispatchers,
                dispatcher_side=dispatcher_side,
                addresses=service.addresses(),
                key=key,
                timeout=timeout,
            )
            config.write(configfile)
        config = broadcast_object(config, root_rank=0, name="TfDataServiceConfig")
        compute_worker_fn(config)
    finally:
        if service is not None:
            service.shutdown()


def _parse(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configfile", help="where rank 0 writes the compute service's config")
    parser.add_argument("--dispatchers", type=int, default=1, help="number of dispatchers (default 1)")
    parser.add_argument(
        "--dispatcher-side", default="compute", choices=["compute", "training"], help="where dispatchers run"
    )
    parser.add_argument("--timeout", type=int, default=60, help="seconds to wait for each registration")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse()
    main(args.dispatchers, args.dispatcher_side, args.configfile, args.timeout)
