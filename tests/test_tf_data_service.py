"""hvdlite.tensorflow.data (Horovod's tf.data service compute worker) on 2 ranks, with tf.data's
real dispatcher and worker servers: every rank runs the compute job's main() in a thread, as
Horovod's test_compute_worker.py does, and reads its dataset back through the service. The
contract checked is tf.data's: in distributed_epoch mode a job hands out every element exactly
once, so separate jobs give each rank the whole dataset, and one shared job ("reuse_dataset")
splits it between the ranks with nothing lost or repeated. Slow: TensorFlow and gRPC servers."""

import os

import pytest
from helpers import TF_SPAWN_ENV, run_pooled

pytestmark = pytest.mark.slow


def _read_through_the_service(configfile, side, reuse):
    import threading

    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service
    from hvdlite.tensorflow.data.compute_worker import main

    hvd.init()
    rank = hvd.rank()
    worker = threading.Thread(target=main, args=(1, side, configfile, 20), daemon=True)
    worker.start()
    config = TfDataServiceConfig.read(configfile, wait_for_file_creation=True)
    dataset = tf.data.Dataset.range(64).batch(8)
    try:
        if side == "compute":
            dataset = dataset.send_to_data_service(config, rank, hvd.size(), reuse_dataset=reuse)
            got = [int(x) for batch in dataset.as_numpy_iterator() for x in batch]
        else:
            with tf_data_service(config, rank) as address:
                dataset = dataset.apply(
                    tf.data.experimental.service.distribute(
                        "distributed_epoch", service=address, job_name="job" if reuse else None
                    )
                )
                got = [int(x) for batch in dataset.as_numpy_iterator() for x in batch]
                everyone = hvd.allgather_object(got, name="read")  # before rank 0's dispatcher stops
        if side == "compute":
            everyone = hvd.allgather_object(got, name="read")
    finally:
        hvd.barrier()
        if rank == 0:
            config.compute_client().shutdown()
        worker.join(20)
    alive = worker.is_alive()
    hvd.barrier()
    if rank == 0:
        os.unlink(configfile)
    return everyone, alive


@pytest.mark.parametrize("side", ["compute", "training"])
@pytest.mark.parametrize("reuse", [False, True], ids=["job-per-rank", "shared-job"])
def test_every_element_is_read_once_per_job(tmp_path, side, reuse):
    configfile = str(tmp_path / "compute.json")
    for everyone, alive in run_pooled(
        _read_through_the_service, 2, args=(configfile, side, reuse), timeout=120, spawn_env=TF_SPAWN_ENV
    ):
        assert not alive, "the compute worker did not stop after shutdown"
        if reuse:
            assert sorted(everyone[0] + everyone[1]) == list(range(64))
        else:
            assert sorted(everyone[0]) == sorted(everyone[1]) == list(range(64))
