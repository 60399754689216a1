"""Policy of the stateful gradient compressors (``Compression.powersgd``, ``.topk``,
``.sign``), written once for every framework: which tensors are compressed and which
go uncompressed, how many bytes each sends, which collective carries them, and the
layout of the state they keep. The tensor math is the adapter's
(``hvdlite/torch/compressors.py``).

Contracts shared by every stateful compressor:
- Error feedback: each rank adds its residual (what it did not send last time) to the
  gradient before compressing, and keeps as its new residual exactly what its own
  compressed contribution leaves out, so over the ranks, sum of residuals + size x the
  averaged output == sum of (gradient + previous residual).
- Every rank decompresses the same aggregated bytes in the same order, so replicas stay
  bit-identical.
- Residuals are per rank; the shared part (step counters, PowerSGD's Q) is equal on
  every rank and is what ``broadcast_optimizer_state`` takes from the root.
"""

import math
from typing import Any, NamedTuple

from hvdlite.common import dtypes, exceptions

# Key of the compressor's state inside a DistributedOptimizer's state_dict().
STATE_KEY = "hvdlite_compression"

# A tensor with fewer elements than this goes uncompressed (its allreduce is latency,
# not bandwidth); so does every 1-D tensor (biases, norms). Each compressor takes
# min_numel= to change it.
DEFAULT_MIN_NUMEL = 4096

# The scaled sign has one scale per chunk of at least this many elements (whole rows).
# Smaller chunks are not better everywhere: on the MLP of docs/compression.md chunk=64 (a
# scale per row of its 1024 x 64 first layer) lifts sign's accuracy from 92.5% to 95.8%
# (uncompressed: 96.1%), on the small model of tests/test_tf_compression.py it trains to a
# higher loss than 256; so 256 stays the default and benchmarks/slow_links.py passes 64.
DEFAULT_SIGN_CHUNK = 256


class Plan(NamedTuple):
    """How one tensor travels: method ("powersgd", "topk", "sign" or "none"), why,
    the collective ("allreduce" or "allgather"), the bytes this rank submits and the
    bytes the uncompressed float32 allreduce would have submitted."""

    method: str
    reason: str
    collective: str
    wire_bytes: int
    dense_bytes: int


def _numel(shape):
    return int(math.prod(shape)) if shape else 1


def uncompressed(shape, itemsize, reason):
    n = _numel(shape) * itemsize
    return Plan("none", reason, "allreduce", n, n)


def _too_small(shape, is_float, min_numel):
    """Why a tensor goes uncompressed, or None when it may be compressed."""
    if not is_float:
        return "not floating point"
    if len(shape) < 2 or sum(1 for d in shape if d > 1) < 2:
        return "1-D"
    if _numel(shape) < min_numel:
        return "fewer than %d elements" % min_numel
    return None


def matrix_shape(shape):
    """The 2-D view every compressor works on: (first dimension, the rest)."""
    return int(shape[0]), _numel(shape[1:])


def gather_wins(segment_bytes, dense_bytes, size):
    """Whether an allgather of `segment_bytes` per rank moves fewer bytes per rank than a
    ring allreduce of `dense_bytes`: (size-1) x segment against 2 (size-1)/size x dense.
    Beyond the crossover (size x segment >= 2 x dense) a sparse compressor sends its
    contribution densified through an allreduce instead, so it never costs more than
    the uncompressed allreduce."""
    return size * segment_bytes < 2 * dense_bytes


def powersgd_plan(shape, is_float, itemsize, rank, min_numel):
    dense = _numel(shape) * 4
    reason = _too_small(shape, is_float, min_numel)
    if reason is not None:
        return uncompressed(shape, itemsize, reason)
    n, m = matrix_shape(shape)
    r = min(rank, n, m)
    wire = (n + m) * r * 4
    if 2 * wire > dense:
        return uncompressed(shape, itemsize, "rank %d saves less than half of %dx%d" % (r, n, m))
    return Plan("powersgd", "rank %d" % r, "allreduce", wire, dense)


def topk_count(numel, ratio):
    return max(1, int(numel * ratio))


def topk_plan(shape, is_float, itemsize, ratio, size, min_numel):
    dense = _numel(shape) * 4
    reason = _too_small(shape, is_float, min_numel)
    if reason is not None:
        return uncompressed(shape, itemsize, reason)
    k = topk_count(_numel(shape), ratio)
    segment = 8 * k  # int32 index + float32 value per element
    if 2 * segment > dense:
        return uncompressed(shape, itemsize, "ratio %g keeps too much" % ratio)
    if gather_wins(segment, dense, size):
        return Plan("topk", "k=%d" % k, "allgather", segment, dense)
    return Plan("topk", "k=%d, densified past the allgather crossover" % k, "allreduce", dense, dense)


def sign_layout(shape, min_chunk):
    """(chunk length, number of chunks): a chunk is whole rows of the 2-D view, at
    least min_chunk elements (the last chunk may be shorter)."""
    n, m = matrix_shape(shape)
    rows = max(1, -(-min_chunk // m))
    chunk = rows * m
    return chunk, -(-(n * m) // chunk)


def sign_segment_bytes(numel, chunks):
    """Packed bits (1 per element, padded to a byte, then to 4 bytes) + a float32
    scale per chunk."""
    return 4 * (-(-numel // 32)) + 4 * chunks


def sign_plan(shape, is_float, itemsize, min_chunk, size, min_numel):
    dense = _numel(shape) * 4
    reason = _too_small(shape, is_float, min_numel)
    if reason is not None:
        return uncompressed(shape, itemsize, reason)
    chunk, chunks = sign_layout(shape, min_chunk)
    segment = sign_segment_bytes(_numel(shape), chunks)
    if gather_wins(segment, dense, size):
        return Plan("sign", "%d chunks of %d" % (chunks, chunk), "allgather", segment, dense)
    return Plan("sign", "densified past the allgather crossover", "allreduce", dense, dense)


def check_cross_host_only(value):
    if value not in (None, True, False):
        raise exceptions.InvalidArgumentError(
            "cross_host_only must be None, True or False, got %r" % (value,)
        )
    return value


def two_level_layout(every):
    """From every rank's (rank, local rank, local size, host index), in rank order:
    (ranks of each host, the hosts' first ranks) when the job has 2+ hosts each holding the
    same number (2+) of consecutive ranks in local-rank order, else (None, None)."""
    local_size = every[0][2]
    hosts = 1 + max(e[3] for e in every)
    if hosts < 2 or local_size < 2 or len(every) != hosts * local_size:
        return None, None
    for rank, local_rank, size, host in every:
        if size != local_size or rank != host * local_size + local_rank:
            return None, None
    local = [list(range(h * local_size, (h + 1) * local_size)) for h in range(hosts)]
    return local, [h * local_size for h in range(hosts)]


def check_reduction(op, name):
    if op not in (dtypes.Average, dtypes.Sum):
        raise exceptions.NotSupportedError(
            "gradient %r: stateful compressors reduce with op Average or Sum only;"
            " use Compression.none or .fp16 with other ops" % (name,)
        )


def output_scale(op, prescale, postscale, size):
    """What multiplies the sum over ranks: DistributedOptimizer's scale factors, and
    1/size for Average."""
    scale = prescale * postscale
    return scale / size if op == dtypes.Average else scale


def check_positive_int(value, what, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise exceptions.InvalidArgumentError("%s must be an integer >= %d, got %r" % (what, minimum, value))
    return value


def check_ratio(ratio):
    if not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
        raise exceptions.InvalidArgumentError("topk ratio must be in (0, 1], got %r" % (ratio,))
    return float(ratio)


def check_momentum(momentum):
    if not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
        raise exceptions.InvalidArgumentError("topk momentum must be in [0, 1), got %r" % (momentum,))
    return float(momentum)


class CompressorState:
    """What a stateful compressor keeps, keyed by gradient name: per-rank tensors
    (``local``: residuals, DGC's velocity) and tensors or numbers equal on every rank
    (``shared``: step counters, PowerSGD's Q). Owned by one compressor, used by the
    thread that runs backward and step(); not thread-safe."""

    def __init__(self):
        self.local: dict[str, dict[str, Any]] = {}
        self.shared: dict[str, dict[str, Any]] = {}
        # (name, key) of the local tensors stored by put() that no state_dict() has handed
        # out since: only these may be overwritten in place (owns()).
        self._owned: set[tuple[str, str]] = set()

    def local_of(self, name):
        return self.local.setdefault(name, {})

    def put(self, name, key, tensor):
        """Stores a local tensor the compressor made itself (owns() is then True for it)."""
        self.local_of(name)[key] = tensor
        self._owned.add((name, key))

    def owns(self, name, key):
        """Whether the local tensor under (name, key) may be reused in place: stored by
        put() and not handed out by state_dict() (nor loaded) since."""
        return (name, key) in self._owned

    def shared_of(self, name):
        return self.shared.setdefault(name, {})

    def state_dict(self):
        """References to the current tensors. A returned dict stays a snapshot: a compressor
        replaces, never mutates, a tensor handed out here (owns() is False for all of them
        from now on)."""
        self._owned.clear()
        return {
            "local": {k: dict(v) for k, v in self.local.items()},
            "shared": {k: dict(v) for k, v in self.shared.items()},
        }

    def load_state_dict(self, state):
        if not isinstance(state, dict) or set(state) != {"local", "shared"}:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise exceptions.InvalidArgumentError(
                "not a compressor state (expected a dict with keys 'local' and 'shared'), got %r: load a"
                " state_dict() of a DistributedOptimizer with a stateful compressor" % (got,)
            )
        self._owned.clear()  # the caller's tensors: never overwritten in place
        self.local = {k: dict(v) for k, v in state["local"].items()}
        self.shared = {k: dict(v) for k, v in state["shared"].items()}
