"""Horovod's horovod.runner.common.util.secret helpers (the compute service's key, HMAC digests),
for hvdlite's compatibility namespace."""

import hashlib
import hmac
import os

SECRET_LENGTH = 32  # bytes
DIGEST_LENGTH = 32  # bytes
HOROVOD_SECRET_KEY = "_HOROVOD_SECRET_KEY"


def make_secret_key():
    """SECRET_LENGTH random bytes."""
    return os.urandom(SECRET_LENGTH)


def compute_digest(key, message):
    """HMAC-SHA256 of `message` under `key`."""
    return hmac.new(key, message, hashlib.sha256).digest()


def check_digest(key, message, digest):
    """Whether `digest` is compute_digest(key, message), compared in constant time."""
    return hmac.compare_digest(compute_digest(key, message), digest)
