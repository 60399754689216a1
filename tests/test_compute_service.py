"""The compute service (hvdlite/runner/compute_service.py) that hvdlite.tensorflow.data's
dispatchers, workers and training ranks meet through, in one process with threads: real store
server, real clients. The tf.data servers on top of it run in Horovod's test_compute_worker.py
(tests/test_horovod_suites.py, slow) and tests/test_tf_data_service.py (slow: TensorFlow)."""

import os
import threading

import pytest

from hvdlite.common.exceptions import HvdliteTimeoutError, InvalidArgumentError
from hvdlite.elastic.store import StoreError
from hvdlite.runner.compute_service import ComputeClient, ComputeService


@pytest.fixture
def service():
    key = os.urandom(32)
    svc = ComputeService(2, 2, key=key)
    yield svc, key
    svc.shutdown()


def test_dispatchers_and_workers_register_and_waits_see_them(service):
    svc, key = service
    assert all(addrs and addrs[0][1] > 0 for addrs in svc.addresses().values())
    client = ComputeClient(svc.addresses(), key)
    client.register_dispatcher(1, "grpc://localhost:5001")
    client.register_dispatcher(1, "grpc://localhost:5001")  # again, same address: fine
    assert client.wait_for_dispatcher_registration(1, 1) == "grpc://localhost:5001"
    client.register_worker_for_dispatcher(1, 2)
    client.register_worker_for_dispatcher(1, 2)  # a worker counts once
    with pytest.raises(HvdliteTimeoutError, match="1 of 2"):
        client.wait_for_dispatcher_worker_registration(1, 0.2)
    client.register_worker_for_dispatcher(1, 3)
    client.wait_for_dispatcher_worker_registration(1, 1)


def test_bad_registrations_are_horovods_errors(service):
    svc, key = service
    client = ComputeClient(svc.addresses(), key)
    client.register_dispatcher(0, "grpc://a:1")
    with pytest.raises(ValueError, match="already been registered under different address grpc://a:1"):
        client.register_dispatcher(0, "grpc://b:2")
    with pytest.raises(IndexError, match=r"\[0..1\]: 2"):
        client.register_dispatcher(2, "grpc://c:3")
    with pytest.raises(HvdliteTimeoutError, match="dispatcher 1 to register"):
        client.wait_for_dispatcher_registration(1, 0.2)
    with pytest.raises(TimeoutError, match="dispatcher 1 to register"):  # Python's own, too
        client.wait_for_dispatcher_registration(1, 0.2)
    with pytest.raises(InvalidArgumentError):
        ComputeService(0, 1, key=key)


def test_a_wrong_key_is_refused(service):
    svc, _ = service
    with pytest.raises(StoreError, match="Compute service"):
        ComputeClient(svc.addresses(), os.urandom(32))


def test_shutdown_releases_every_waiting_worker_before_the_service_stops():
    key = os.urandom(32)
    svc = ComputeService(1, 2, key=key)
    released = []

    def worker(index):
        client = ComputeClient(svc.addresses(), key)
        client.register_worker_for_dispatcher(0, index)
        client.wait_for_shutdown()
        released.append(index)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    ComputeClient(svc.addresses(), key).wait_for_dispatcher_worker_registration(0, 10)
    ComputeClient(svc.addresses(), key).shutdown()  # a client's request, as the training side sends it
    for t in threads:
        t.join(10)
    svc.shutdown()  # returns once both saw it; then the store is gone
    assert sorted(released) == [0, 1]
    svc.shutdown()  # idempotent
