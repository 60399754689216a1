"""The compute service: the meeting point of a tf.data service's dispatchers, its workers and the
training ranks that read from it (Horovod's horovod.runner.common.service.compute_service, with
its API). It is framework-neutral; hvdlite/tensorflow/data/ builds tf.data's servers on it.

The service is the core's HMAC-authenticated rendezvous store (csrc/rendezvous/tcp_store.h),
hosted by the process that makes a ComputeService; every ComputeClient is a store client
(hvdlite/elastic/store.py) that proves the same key. The state lives in these keys:

    compute/dispatchers                 the number of dispatchers (set by the service)
    compute/dispatcher/<i>              the address dispatcher i registered (first one wins)
    compute/dispatcher/<i>/claims       how many registrations dispatcher i has seen
    compute/dispatcher/<i>/workers      how many distinct workers registered for dispatcher i
    compute/dispatcher/<i>/worker/<w>   1 once worker w registered for dispatcher i
    compute/shutdown                    set once a shutdown was requested
    compute/shutdown/waiting, /released clients that entered and left wait_for_shutdown()

Blocking and timeouts: every wait takes a timeout in seconds (wait_for_shutdown none, as in
Horovod) and polls the store every 50 ms at most; an expired wait raises HvdliteTimeoutError.
ComputeService.shutdown() lets the clients blocked in wait_for_shutdown() see the request (at
most RELEASE_TIMEOUT_S) before the store goes away. Threading: a client may be shared by
threads (the store client serializes requests); the service's methods are thread-safe.
"""

import socket
import threading
import time

from hvdlite.common.exceptions import HvdliteTimeoutError, InvalidArgumentError, OutOfRangeError
from hvdlite.common.native import core as _core
from hvdlite.elastic.store import StoreClient, StoreError
from hvdlite.runner.hosts import LOOPBACK, interface_address

NAME = "Compute service"
RELEASE_TIMEOUT_S = 10.0  # how long shutdown() waits for the clients in wait_for_shutdown()
_PREFIX = "compute/"


def _interfaces(nics):
    """{interface name: IPv4 address} of this host's interfaces (only those in `nics` if given),
    loopback last: a client on another host tries the others first (loopback would reach its own
    host, and a connection refused there is retried for seconds)."""
    out = {}
    for _, name in sorted(socket.if_nameindex(), key=lambda i: i[1] == "lo"):
        if nics and name not in nics:
            continue
        addr = interface_address([name])
        if addr is not None:
            out[name] = addr
    return out or {"lo": LOOPBACK}


class ComputeService:
    """Hosts the service in this process, on every interface (or those named by `nics`), until
    shutdown(). dispatchers and workers_per_dispatcher must be positive; key: the bytes every
    client must prove (horovod.runner.common.util.secret.make_secret_key())."""

    NAME = NAME

    def __init__(self, dispatchers, workers_per_dispatcher, key, nics=None):
        if dispatchers <= 0:
            raise InvalidArgumentError(f"The number of dispatchers must be larger than 0: {dispatchers}")
        if workers_per_dispatcher <= 0:
            raise InvalidArgumentError(
                f"The number of workers per dispatcher must be larger than 0: {workers_per_dispatcher}"
            )
        self._dispatchers = dispatchers
        self._workers_per_dispatcher = workers_per_dispatcher
        self._lock = threading.Lock()
        self._server = _core.TcpStoreServer("0.0.0.0", 0, key)  # clients must prove the key
        port = self._server.port
        self._addresses = {name: [(addr, port)] for name, addr in _interfaces(nics).items()}
        self._client = StoreClient("%s:%d" % (LOOPBACK, port), key, name=NAME)
        self._client.set(_PREFIX + "dispatchers", str(dispatchers))
        self._client.set(_PREFIX + "workers_per_dispatcher", str(workers_per_dispatcher))
        self._stopped = False

    def addresses(self):
        """{interface name: [(ip, port)]} where clients reach the service."""
        return {name: list(addrs) for name, addrs in self._addresses.items()}

    def shutdown(self):
        """Requests shutdown (releasing every wait_for_shutdown()), waits until the clients that
        wait for it saw it (at most RELEASE_TIMEOUT_S), then stops the store. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._client.set(_PREFIX + "shutdown", "1")
            # A client counts from its entry into wait_for_shutdown() (a compute rank enters it
            # right after registering its worker, seconds before anyone asks for shutdown).
            deadline = time.monotonic() + RELEASE_TIMEOUT_S
            while time.monotonic() < deadline:
                waiting = self._client.add(_PREFIX + "shutdown/waiting", 0)
                if self._client.add(_PREFIX + "shutdown/released", 0) >= waiting:
                    break
                time.sleep(0.01)
            self._client.close()
            self._server.stop()


class ComputeClient:
    """A client of the ComputeService at `compute_addresses` ({interface: [(ip, port)]}, as
    addresses() returns), authenticated with `key`. Connects to the first address that answers;
    HvdliteError when none does. verbose: kept for Horovod's signature (nothing is printed)."""

    def __init__(self, compute_addresses, key, verbose=1):
        self.verbose = verbose
        errors = []
        for addrs in compute_addresses.values():
            for host, port in addrs:
                try:
                    self._store = StoreClient("%s:%d" % (host, port), key, connect_timeout=5.0, name=NAME)
                    self._dispatchers = int(self._store.get(_PREFIX + "dispatchers", 5.0))
                    return
                except StoreError as e:
                    errors.append(str(e))
        raise StoreError(
            "cannot reach the compute service at %s: %s" % (compute_addresses, "; ".join(errors))
        )

    def _check_id(self, dispatcher_id):
        if not 0 <= dispatcher_id < self._dispatchers:
            raise OutOfRangeError(
                f"Dispatcher id must be within [0..{self._dispatchers - 1}]: {dispatcher_id}"
            )

    def register_dispatcher(self, dispatcher_id, dispatcher_address):
        """Registers dispatcher `dispatcher_id` at `dispatcher_address`. Registering it again at the
        same address is fine; at another address is a ValueError (InvalidArgumentError)."""
        self._check_id(dispatcher_id)
        key = _PREFIX + "dispatcher/%d" % dispatcher_id
        if self._store.add(key + "/claims", 1) == 1:
            self._store.set(key, dispatcher_address)
            return
        registered = self._store.get(key, 30.0).decode()  # the first claimer sets it right after
        if registered != dispatcher_address:
            raise InvalidArgumentError(
                f"Dispatcher with id {dispatcher_id} has already been registered under different "
                f"address {registered}: {dispatcher_address}"
            )

    def wait_for_dispatcher_registration(self, dispatcher_id: int, timeout: float) -> str:
        """The address of dispatcher `dispatcher_id`, once registered; waits at most `timeout` s."""
        self._check_id(dispatcher_id)
        try:
            return str(self._store.get(_PREFIX + "dispatcher/%d" % dispatcher_id, timeout).decode())
        except StoreError as e:
            raise HvdliteTimeoutError(
                f"Timed out after {timeout} s waiting for dispatcher {dispatcher_id} to register. Try to "
                "find out what takes the dispatcher so long to register or increase timeout."
            ) from e

    def register_worker_for_dispatcher(self, dispatcher_id, worker_id):
        """Counts worker `worker_id` as registered for dispatcher `dispatcher_id` (once)."""
        self._check_id(dispatcher_id)
        key = _PREFIX + "dispatcher/%d" % dispatcher_id
        if self._store.add(key + "/worker/%d" % worker_id, 1) == 1:
            self._store.add(key + "/workers", 1)

    def wait_for_dispatcher_worker_registration(self, dispatcher_id, timeout):
        """Waits (at most `timeout` s) until every worker of dispatcher `dispatcher_id` registered.
        With a single dispatcher, any id waits for dispatcher 0, as in Horovod."""
        self._check_id(dispatcher_id)
        dispatcher_id = dispatcher_id if self._dispatchers > 1 else 0
        wanted = int(self._store.get(_PREFIX + "workers_per_dispatcher", 5.0))
        key = _PREFIX + "dispatcher/%d/workers" % dispatcher_id
        deadline = time.monotonic() + timeout
        while self._store.add(key, 0) < wanted:
            if time.monotonic() >= deadline:
                raise HvdliteTimeoutError(
                    f"Timed out after {timeout} s waiting for the workers of dispatcher {dispatcher_id} to "
                    f"register ({self._store.add(key, 0)} of {wanted}). Try to find out what takes the "
                    "workers so long to register or increase timeout."
                )
            time.sleep(0.05)

    def shutdown(self):
        """Requests the service's shutdown: releases every wait_for_shutdown(); does not block."""
        self._store.set(_PREFIX + "shutdown", "1")

    def wait_for_shutdown(self):
        """Blocks until a shutdown is requested (no timeout, as in Horovod)."""
        self._store.add(_PREFIX + "shutdown/waiting", 1)
        self._store.get(_PREFIX + "shutdown", float("inf"))
        self._store.add(_PREFIX + "shutdown/released", 1)
