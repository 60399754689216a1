"""The five collectives as benchmark cases: buffers, rank-dependent data, expected results.

Sizes follow nccl-tests: `count` float32 elements are the per-rank buffer of allreduce,
broadcast and alltoall, and the whole array (per-rank count x n) of allgather and
reducescatter. busbw = algbw x BUS_FACTOR[op](n).

Data: every value is a small integer, so float32 sums are exact and a result either matches
the NumPy expectation bit for bit or counts as wrong (per element, as nccl-tests' #wrong).
"""

import numpy as np

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
BUS_FACTOR = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
_SPLIT_OPS = ("allgather", "alltoall", "reducescatter")  # need count divisible by n
F32 = np.float32


def element_count(op, nbytes, n):
    """float32 elements for `nbytes`: rounded down to a multiple of n where the op splits the
    array (at least n)."""
    count = max(1, nbytes // 4)
    if op in _SPLIT_OPS:
        count = max(n, count // n * n)
    return count


def _base(m):
    """0, 1, .., 6, 0, 1, .. as float32 (m elements), built without an int64 temporary."""
    return np.resize(np.arange(7, dtype=F32), m)


class Case:
    """One collective of `count` elements on `comm`: owns its input (and output) buffers."""

    def __init__(self, comm, op, count):
        self.comm, self.op, self.count = comm, op, count
        n = comm.size
        self.block = count // n
        self.fn = getattr(comm, op)
        in_count = self.block if op == "allgather" else count
        out_count = {"allgather": count, "alltoall": count, "reducescatter": self.block}.get(op)
        self.inp = np.empty(in_count, dtype=F32)
        self.out = None if out_count is None else np.empty(out_count, dtype=F32)

    @property
    def nbytes(self):
        return self.count * 4

    def call(self):
        """One call of the collective; returns its result array."""
        if self.out is None:
            return self.fn(self.inp)
        return self.fn(self.inp, self.out)

    def zero(self):
        """Zeroes (and so touches every page of) the buffers this case owns."""
        self.inp.fill(0)
        if self.out is not None:
            self.out.fill(0)

    def _fill(self):
        r, n, op = self.comm.rank, self.comm.size, self.op
        if op in ("allreduce", "reducescatter"):
            self.inp[:] = _base(self.count) + (r + 1)
        elif op == "broadcast":
            self.inp[:] = _base(self.count) + 1 if r == 0 else -1
        elif op == "allgather":
            self.inp[:] = _base(self.block) + 10 * r
        else:  # alltoall: block j goes to rank j
            for j in range(n):
                self.inp[j * self.block : (j + 1) * self.block] = _base(self.block) + 10 * (r * n + j)
        if self.out is not None:
            self.out.fill(-3)  # a value no correct result holds

    def _expected(self):
        r, n, op = self.comm.rank, self.comm.size, self.op
        if op == "allreduce":
            return _base(self.count) * n + n * (n + 1) / 2
        if op == "reducescatter":
            return (_base(self.count) * n + n * (n + 1) / 2)[r * self.block : (r + 1) * self.block]
        if op == "broadcast":
            return _base(self.count) + 1
        if op == "allgather":
            return np.concatenate([_base(self.block) + 10 * j for j in range(n)])
        return np.concatenate([_base(self.block) + 10 * (j * n + r) for j in range(n)])

    def check(self):
        """Runs the collective once on rank-dependent data; returns the number of wrong
        elements on this rank (all of them when the result has the wrong size)."""
        self._fill()
        result = np.asarray(self.call()).reshape(-1)
        expected = self._expected().astype(F32)
        if result.size != expected.size:
            return int(expected.size)
        return int(np.count_nonzero(result != expected))
