"""Adasum on the CPU path, in framework-neutral NumPy over the public collectives.

Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation")
combines two gradients a and b as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(orthogonal vectors are added, parallel ones averaged), and a power-of-two
number of ranks in a recursive-halving tree: first ranks (0,1), (2,3), ...,
then the pair results (0-1, 2-3), and so on up to one vector.

The core has no Adasum kernel, so an Adasum allreduce here is an allgather of
every member's tensor followed by the same tree evaluated locally on every
member: correct, and bitwise identical on every rank because every rank runs
the same float64 arithmetic on the same bytes. It moves (n-1)x the data of a
ring allreduce, which is acceptable for the CPU path it serves.

As in Horovod, the number of members must be a power of two.
"""

import numpy as np

from hvdlite.common import collectives, dtypes, exceptions, naming, ops
from hvdlite.common.process_sets import resolve
from hvdlite.common.topology import size
from hvdlite.common.util import num_rank_is_power_2

_FLOAT_CODES = (dtypes.FLOAT16, dtypes.BFLOAT16, dtypes.FLOAT32, dtypes.FLOAT64)


class AdasumNotSupportedError(exceptions.NotSupportedError, NotImplementedError):
    """Adasum cannot run on this number of ranks (not a power of two); also a
    NotImplementedError, as Horovod raises."""


def combine(a, b):
    """Adasum of two float64 vectors. A zero vector contributes nothing and
    leaves the other unchanged."""
    dot = float(np.dot(a, b))
    a_sq, b_sq = float(np.dot(a, a)), float(np.dot(b, b))
    a_coeff = 1.0 - dot / (2.0 * a_sq) if a_sq > 0.0 else 1.0
    b_coeff = 1.0 - dot / (2.0 * b_sq) if b_sq > 0.0 else 1.0
    return a_coeff * a + b_coeff * b


def tree_reduce(rows):
    """Adasum of the rows of a (n, k) float64 array, n a power of two, in the
    recursive-halving order (pairs at distance 1, then 2, 4, ...)."""
    vectors = [row for row in rows]
    n = len(vectors)
    if not num_rank_is_power_2(n):
        raise AdasumNotSupportedError("Adasum needs a power-of-two number of ranks, got %d" % n)
    distance = 1
    while distance < n:
        for i in range(0, n, 2 * distance):
            vectors[i] = combine(vectors[i], vectors[i + distance])
        distance *= 2
    return vectors[0]


def decode_float64(data, code, count):
    """The core's output bytes (uint8 array) as float64 values."""
    if count == 0 or data is None:
        return np.zeros(0, np.float64)
    if code == dtypes.BFLOAT16:  # bfloat16 is the top half of a float32
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    numpy_type = {dtypes.FLOAT16: np.float16, dtypes.FLOAT32: np.float32, dtypes.FLOAT64: np.float64}[code]
    return data.view(numpy_type).astype(np.float64)


def allreduce_inplace(adapter, tensor, name, prescale, postscale, process_set):
    """Pending Adasum allreduce of `tensor` in place over `process_set`;
    finish() returns `tensor`."""
    members = size() if process_set is None or process_set.process_set_id == 0 else process_set.size()
    if not num_rank_is_power_2(members):
        raise AdasumNotSupportedError(
            "Running Adasum with non-power of 2 ranks is not supported yet "
            "(tensor '%s', %d ranks)" % (name, members)
        )
    qualified = naming.auto_name("allreduce", name, adapter.qualified_names)
    buf = adapter.describe(tensor, qualified)
    _, code, shape, _, _, _, _, assign, _ = buf
    shape = tuple(shape)
    if code not in _FLOAT_CODES:
        raise exceptions.NotSupportedError(
            "Adasum needs a floating-point tensor; '%s' has dtype %s" % (name, getattr(tensor, "dtype", "?"))
        )
    count = int(np.prod(shape, dtype=np.int64))
    gather = collectives.submit_output(
        ops.ALLGATHER, qualified, buf, (1, count), None, {"process_set": resolve(process_set)}
    )

    def finish():
        data, _, _, _ = ops.take_output(gather.core)
        rows = decode_float64(data, code, count * members).reshape(members, count) * prescale
        result = tree_reduce(rows) * postscale
        assign(tensor, result.reshape(shape))
        return tensor

    return gather._replace(finish=finish, keepalive=(tensor, gather.keepalive))


def allreduce_inplace_any(adapter, tensor, name, reduce_op, prescale, postscale, process_set):
    """Pending in-place allreduce of `tensor` with any reduce_op (already resolved): Adasum runs
    its steps here (allreduce_inplace), every other op is one core operation. The one routing
    the NumPy and TensorFlow adapters share; finish() returns `tensor`."""
    if reduce_op == dtypes.Adasum:
        name = naming.auto_name("allreduce", name)
        return allreduce_inplace(adapter, tensor, name, prescale, postscale, process_set)
    return collectives.inplace(
        adapter,
        "allreduce",
        ops.ALLREDUCE,
        tensor,
        name,
        reduce_op=reduce_op,
        prescale=prescale,
        postscale=postscale,
        process_set=resolve(process_set),
    )
