"""The tf.data service side of hvdlite.tensorflow.data: the config the compute job hands to the
training job, the servers a compute rank runs, and the training side's view of the dispatcher.

Roles (Horovod's horovod.tensorflow.data.compute_service, with its API):
- compute ranks (compute_worker_fn): rank r belongs to dispatcher r // workers_per_dispatcher;
  with dispatcher_side "compute" the first rank of each group runs that DispatchServer; every
  rank runs one WorkerServer attached to its dispatcher, registers it, and serves until the
  compute service is shut down.
- training ranks: with dispatcher_side "training", tf_data_service() runs the DispatchServer of
  rank r (one per rank, or rank 0's for all when there is one dispatcher) and yields its address
  once its workers registered; with "compute", send_to_data_service() points a dataset at the
  compute side's dispatcher.
Blocking: every wait is bounded by the config's timeout (s), except a compute rank's wait for
shutdown. TfDataServiceConfig is immutable and picklable (broadcast_object sends it).
"""

import binascii
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import tensorflow as tf

from hvdlite.common import basics
from hvdlite.common.exceptions import HvdliteError, InvalidArgumentError
from hvdlite.runner.compute_service import ComputeClient

SIDES = ("compute", "training")
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TfDataServiceConfig:
    """How to reach the compute service: dispatchers and workers per dispatcher, which side runs
    the dispatchers (SIDES), the service's addresses ({interface: [(ip, port)]}) and key, and
    the timeout (s) of every wait for registration."""

    dispatchers: int
    workers_per_dispatcher: int
    dispatcher_side: str
    addresses: Mapping[str, Sequence[tuple[str, int]]]
    key: bytes
    timeout: int = 60

    def compute_client(self, verbose: int = 1) -> ComputeClient:
        return ComputeClient(self.addresses, self.key, verbose=verbose)

    def to_dict(self) -> Mapping[str, Any]:
        out = dataclasses.asdict(self)
        out["key"] = binascii.hexlify(self.key).decode()
        return out

    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> "TfDataServiceConfig":
        return TfDataServiceConfig(
            dispatchers=config["dispatchers"],
            workers_per_dispatcher=config["workers_per_dispatcher"],
            dispatcher_side=config["dispatcher_side"],
            addresses={intf: [(a[0], a[1]) for a in addrs] for intf, addrs in config["addresses"].items()},
            key=binascii.unhexlify(config["key"]),
            timeout=config.get("timeout", 60),
        )

    def write(self, filename: str) -> None:
        """Writes the config as JSON to a temporary file beside `filename`, then renames it into
        place, so that a reader never sees half a file."""
        directory, base = os.path.split(os.path.abspath(filename))
        with tempfile.NamedTemporaryFile("w", dir=directory, prefix=base, delete=False) as out:
            json.dump(self.to_dict(), out)
        os.replace(out.name, filename)

    @staticmethod
    def read(filename: str, wait_for_file_creation: bool = False) -> "TfDataServiceConfig":
        """Reads a config written by write(); wait_for_file_creation: first waits (without a
        bound, polling every 0.1 s) until the file exists."""
        while wait_for_file_creation and not os.path.exists(filename):
            time.sleep(0.1)
        with open(filename) as f:
            return TfDataServiceConfig.from_dict(json.load(f))


def _check_side(config):
    if config.dispatcher_side not in SIDES:
        raise InvalidArgumentError(
            "TfDataServiceConfig.dispatcher_side is %r: it must be one of %s"
            % (config.dispatcher_side, SIDES)
        )


def _stop(server):
    """tf.data's servers have no public stop: _stop() is the one TensorFlow offers."""
    server._stop()
    server.join()


@contextlib.contextmanager
def tf_data_service(compute_config: TfDataServiceConfig, rank: int) -> Iterator[str]:
    """Yields the address of the dispatcher training rank `rank` reads from, once that
    dispatcher's workers registered. With dispatcher_side "training" this rank runs the
    dispatcher (every rank its own, or rank 0 the only one) until the block ends."""
    _check_side(compute_config)
    compute = compute_config.compute_client(verbose=2)
    one = compute_config.dispatchers == 1
    server = None
    if compute_config.dispatcher_side == "training" and (not one or rank == 0):
        server = tf.data.experimental.service.DispatchServer()
        compute.register_dispatcher(rank, server.target)
        log.info("training rank %d runs dispatcher %d at %s", rank, rank, server.target)
    dispatcher_id = 0 if one else rank
    try:
        address = compute.wait_for_dispatcher_registration(dispatcher_id, compute_config.timeout)
        compute.wait_for_dispatcher_worker_registration(dispatcher_id, compute_config.timeout)
        yield address
    finally:
        if server is not None:
            _stop(server)


def send_to_data_service(
    dataset: tf.data.Dataset,
    compute_config: TfDataServiceConfig,
    rank: int,
    size: int | None = None,
    processing_mode: str = "distributed_epoch",
    reuse_dataset: bool = False,
    round_robin: bool = False,
) -> tf.data.Dataset:
    """`dataset`, processed by the compute side's dispatcher of `rank` (also available as the
    method Dataset.send_to_data_service). reuse_dataset: every rank shares one job ("job"), so
    ranks split its elements; round_robin (with reuse_dataset): consumer `rank` of `size`."""
    if compute_config.dispatcher_side == "training":
        raise HvdliteError(  # a RuntimeError, as Horovod's
            "send_to_data_service needs dispatchers on the compute side; with dispatcher_side "
            "'training' use the tf_data_service context manager instead"
        )
    shared = reuse_dataset and round_robin
    with tf_data_service(compute_config, rank) as address:
        return dataset.apply(
            tf.data.experimental.service.distribute(
                processing_mode=processing_mode,
                service=address,
                job_name="job" if reuse_dataset else None,
                consumer_index=rank if shared else None,
                num_consumers=size if shared else None,
            )
        )


tf.data.Dataset.send_to_data_service = send_to_data_service  # Horovod's method on every Dataset


def compute_worker_fn(compute_config: TfDataServiceConfig) -> None:
    """Runs this compute rank's tf.data servers (see the module's roles) until the compute
    service is shut down; then stops them. Blocks."""
    _check_side(compute_config)
    basics.init()
    index = basics.rank()
    dispatcher_id = index // compute_config.workers_per_dispatcher
    compute = compute_config.compute_client(verbose=2)
    dispatcher = None
    if compute_config.dispatcher_side == "compute" and index % compute_config.workers_per_dispatcher == 0:
        dispatcher = tf.data.experimental.service.DispatchServer()
        compute.register_dispatcher(dispatcher_id, dispatcher.target)
        log.info("compute rank %d runs dispatcher %d at %s", index, dispatcher_id, dispatcher.target)
    address = compute.wait_for_dispatcher_registration(dispatcher_id, compute_config.timeout)
    worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=address.split("://", 1)[-1],
            heartbeat_interval_ms=1000,
            dispatcher_timeout_ms=compute_config.timeout * 1000,
        )
    )
    worker.start()
    compute.register_worker_for_dispatcher(dispatcher_id, index)
    log.info("compute rank %d serves dispatcher %d", index, dispatcher_id)
    compute.wait_for_shutdown()
    _stop(worker)
    if dispatcher is not None:
        _stop(dispatcher)
