"""A Python client of the core's TCP rendezvous store (wire protocol: csrc/rendezvous/tcp_store.h).

The elastic driver hosts a TcpStoreServer (hvdlite._core) for the whole job and publishes each
generation of the job in it; the driver itself and every elastic worker talk to it through this
client. Only the standard library is used, so the driver needs no framework.

Contract: one request/reply at a time under a lock (a client may be shared by threads); every
socket operation is bounded by `io_timeout` seconds; a broken connection raises StoreError and
the client stays broken (make a new one).
"""

import hashlib
import hmac
import socket
import struct
import threading
import time

from hvdlite.common.exceptions import HvdliteError

_MAGIC = b"HVDS"
_NONCE_LEN = 32
_PROOF_CONTEXT = b"hvdlite-store-v1"
_SET, _GET, _ADD = 1, 2, 3
_OK, _NOT_FOUND, _BAD_REQUEST = 0, 1, 2


class StoreError(HvdliteError):
    """A store client's store (the elastic driver's, or the compute service) cannot be reached,
    rejected us, or a wait on it expired."""


def _read_exact(sock, n, name="the elastic driver's store"):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise StoreError("%s closed the connection" % name)
        out += chunk
    return out


class StoreClient:
    def __init__(
        self, addr, secret, connect_timeout=30.0, io_timeout=30.0, name="the elastic driver's store"
    ):
        """addr: "host:port"; secret: raw bytes. Retries the connection until connect_timeout.
        name: what error messages call the store's host."""
        host, _, port = addr.rpartition(":")
        self.addr = addr
        self.name = name
        self._lock = threading.Lock()
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=io_timeout)
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise StoreError("cannot reach %s at %s: %s" % (name, addr, e)) from e
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            challenge = _read_exact(self._sock, len(_MAGIC) + _NONCE_LEN, self.name)
            if not challenge.startswith(_MAGIC):
                raise StoreError("%s is not an hvdlite rendezvous store" % addr)
            proof = hmac.new(secret, challenge[len(_MAGIC) :] + _PROOF_CONTEXT, hashlib.sha256).digest()
            self._sock.sendall(proof)
            if _read_exact(self._sock, 1, self.name) != b"\x01":
                raise StoreError("%s at %s rejected our secret" % (name, addr))
        except (OSError, StoreError) as e:
            self._sock.close()
            raise StoreError("cannot join %s at %s: %s" % (name, addr, e)) from e

    def close(self):
        self._sock.close()

    def _call(self, op, key, value=b""):
        k = key.encode()
        request = struct.pack("<BI", op, len(k)) + k + struct.pack("<I", len(value)) + value
        with self._lock:
            try:
                self._sock.sendall(request)
                status, length = struct.unpack("<BI", _read_exact(self._sock, 5, self.name))
                payload = _read_exact(self._sock, length, self.name) if length else b""
            except OSError as e:
                raise StoreError("lost %s at %s: %s" % (self.name, self.addr, e)) from e
        if status == _BAD_REQUEST:
            raise StoreError(payload.decode(errors="replace"))
        return status, payload

    def set(self, key, value):
        self._call(_SET, key, value if isinstance(value, bytes) else str(value).encode())

    def try_get(self, key):
        """The value of `key` (bytes), or None when it is not set; never waits."""
        status, payload = self._call(_GET, key)
        return None if status == _NOT_FOUND else payload

    def get(self, key, timeout):
        """Waits until `key` exists (polling every few ms, at most 50 ms), at most `timeout` s."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            value = self.try_get(key)
            if value is not None:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreError("timed out after %.0f s waiting for '%s' in %s" % (timeout, key, self.name))
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)

    def add(self, key, delta):
        _, payload = self._call(_ADD, key, struct.pack("<q", delta))
        return struct.unpack("<q", payload)[0]
