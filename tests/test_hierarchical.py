"""Two-level allreduce and allgather across hosts (HVDLITE_HIERARCHICAL_ALLREDUCE / _ALLGATHER), on one machine: ranks
claim hosts through HVDLITE_HOSTNAME, so ranks of one "host" share memory and hosts talk TCP.
The simulated-hosts version runs in tests/test_multihost.py."""

import numpy as np
import pytest
from helpers import run_ranks

pytestmark = pytest.mark.slow


def _suite():
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    for dt in (np.float32, np.float64, np.int32, np.float16):
        for count in (0, 1, n - 1, 3 * n + 1, 70001):
            x = ((np.arange(count) * (r + 3)) % 11).astype(dt)
            for op, name in ((hvd.Sum, "sum"), (hvd.Max, "max"), (hvd.Min, "min")):
                out["%s_%s_%d" % (name, np.dtype(dt).name, count)] = hvd.allreduce(
                    x, op=op, name="t_%s_%s_%d" % (name, np.dtype(dt).name, count)
                )
    out["avg"] = hvd.allreduce(np.arange(1001, dtype=np.float64) * (r + 1), op=hvd.Average, name="avg")
    out["pre_post"] = hvd.allreduce(
        np.ones(5000, np.float32), op=hvd.Sum, name="pp", prescale_factor=2.0, postscale_factor=0.25
    )
    return out


def _reference(name, n):
    op, dtname, count = name.split("_")
    dt, count = np.dtype(dtname), int(count)
    xs = [((np.arange(count) * (q + 3)) % 11).astype(dt) for q in range(n)]
    if op == "sum":
        return sum(xs[1:], xs[0]).astype(dt)
    return (np.maximum if op == "max" else np.minimum).reduce(xs)


@pytest.mark.parametrize(
    "hosts",
    [["a", "a", "b", "b"], ["a", "b", "a", "b"], ["a", "a", "b", "b", "c", "c"], ["a", "a", "a", "b"]],
    ids=["2x2", "interleaved", "3x2", "uneven-falls-back-to-flat"],
)
def test_two_level_allreduce_matches_numpy_and_is_identical_everywhere(hosts):
    n = len(hosts)
    env = lambda rank: {"HVDLITE_HOSTNAME": hosts[rank], "HVDLITE_HIERARCHICAL_ALLREDUCE": "1"}  # noqa: E731
    results = run_ranks(_suite, n, env=env, timeout=120)
    for name, value in results[0].items():
        for other in results[1:]:
            assert other[name].tobytes() == value.tobytes(), name
        if name == "avg":
            np.testing.assert_allclose(value, np.arange(1001) * (n + 1) / 2)
        elif name == "pre_post":
            np.testing.assert_allclose(value, np.full(5000, n * 0.5))
        elif value.dtype == np.float16:
            np.testing.assert_allclose(value, _reference(name, n), rtol=2e-3)
        else:
            np.testing.assert_array_equal(value, _reference(name, n))


# Sizes that cut into several pipeline chunks (about 2 MiB each), with odd
# element counts so chunks, host blocks and cross sub-blocks are all uneven.
_CHUNKED = ((np.float32, 1_500_007), (np.float64, 2_621_447), (np.int32, 3_000_017), (np.float16, 1_048_579))


def _chunked_suite():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    out = {}
    for dt, count in _CHUNKED:
        x = ((np.arange(count) * (r + 3)) % 11).astype(dt)
        name = "sum_%s_%d" % (np.dtype(dt).name, count)
        out[name] = hvd.allreduce(x, op=hvd.Sum, name=name)
    x = ((np.arange(1_000_003) * (r + 5)) % 7).astype(np.int32)
    out["max_int32_1000003"] = hvd.allreduce(x, op=hvd.Max, name="max")
    out["pre_post"] = hvd.allreduce(
        np.ones(2_000_003, np.float32), op=hvd.Sum, name="pp", prescale_factor=2.0, postscale_factor=0.25
    )
    return out


@pytest.mark.parametrize(
    "hosts,shm",
    [(["a", "a", "b", "b"], "0"), (["a", "a", "b", "b", "c", "c"], "0"), (["a", "a", "b", "b"], "1")],
    ids=["2x2", "3x2", "2x2-tcp-only-runs-steps-one-after-the-other"],
)
def test_pipelined_two_level_allreduce_on_odd_sizes(hosts, shm):
    n = len(hosts)
    env = lambda rank: {  # noqa: E731
        "HVDLITE_HOSTNAME": hosts[rank],
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "1",
        "HVDLITE_SHM_DISABLE": shm,
    }
    results = run_ranks(_chunked_suite, n, env=env, timeout=240)
    for name, value in results[0].items():
        for other in results[1:]:
            assert other[name].tobytes() == value.tobytes(), name
        if name == "pre_post":
            np.testing.assert_allclose(value, np.full(2_000_003, n * 0.5))
        elif name.startswith("max"):
            xs = [((np.arange(1_000_003) * (q + 5)) % 7).astype(np.int32) for q in range(n)]
            np.testing.assert_array_equal(value, np.maximum.reduce(xs))
        elif value.dtype == np.float16:
            np.testing.assert_allclose(value, _reference(name, n), rtol=2e-3)
        else:
            np.testing.assert_array_equal(value, _reference(name, n))


# Allgather(v) in two levels (HVDLITE_HIERARCHICAL_ALLGATHER): first dims differ per rank,
# small ones and ones large enough that every host's bytes split unevenly into pieces.
_AG_DTYPES = (np.float32, np.float64, np.int32, np.float16, np.uint8)


def _ag_rows(rank, big):
    return (rank * 7 + 1) + (100_003 + 1_001 * rank if big else 0)


def _ag_input(rank, dt, big):
    rows = _ag_rows(rank, big)
    return ((np.arange(rows * 3).reshape(rows, 3) * (rank + 3)) % 251).astype(dt)


def _allgather_suite():
    """Returns (results, this rank's log): the core's debug log goes to fd 2, read back here."""
    import os
    import tempfile

    import hvdlite as hvd

    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            hvd.init()
            r = hvd.rank()
            out = {}
            for dt in _AG_DTYPES:
                for big in (False, True):
                    name = "ag_%s_%d" % (np.dtype(dt).name, big)
                    out[name] = hvd.allgather(_ag_input(r, dt, big), name=name)
            out["ag_empty_on_rank0"] = hvd.allgather(np.arange(5 * r, dtype=np.float32), name="ag_empty")
            out["ag_1d_odd"] = hvd.allgather(np.full(1_000_003 + r, r, np.int32), name="ag_1d_odd")
        finally:
            os.dup2(saved, 2)
        log.seek(0)
        return out, log.read().decode(errors="replace")


def _ag_reference(name, n):
    if name == "ag_empty_on_rank0":
        return np.concatenate([np.arange(5 * q, dtype=np.float32) for q in range(n)])
    if name == "ag_1d_odd":
        return np.concatenate([np.full(1_000_003 + q, q, np.int32) for q in range(n)])
    _, dtname, big = name.split("_")
    return np.concatenate([_ag_input(q, np.dtype(dtname), big == "1") for q in range(n)])


@pytest.mark.parametrize(
    "hosts,shm,two_level",
    [
        (["a", "a", "b", "b"], "0", "2 hosts x 2 ranks"),
        (["a", "a", "b", "b", "c", "c"], "0", "3 hosts x 2 ranks"),
        (["a", "a", "b", "b"], "1", "2 hosts x 2 ranks"),
        (["a", "b", "a", "b"], "0", None),
        (["a", "a", "a", "b"], "0", None),
    ],
    ids=["2x2", "3x2", "2x2-tcp-only", "interleaved-falls-back-to-flat", "uneven-falls-back-to-flat"],
)
def test_two_level_allgatherv_matches_numpy_and_the_flat_ring_bitwise(hosts, shm, two_level):
    n = len(hosts)

    def env(level):
        return lambda rank: {
            "HVDLITE_HOSTNAME": hosts[rank],
            "HVDLITE_HIERARCHICAL_ALLGATHER": level,
            "HVDLITE_SHM_DISABLE": shm,
            "HVDLITE_LOG_LEVEL": "debug",
        }

    hier = run_ranks(_allgather_suite, n, env=env("1"), timeout=240)
    flat = run_ranks(_allgather_suite, n, env=env("0"), timeout=240)
    for _, log in flat:
        assert "allgather in two levels" not in log
    for _, log in hier:
        if two_level:
            assert "allgather in two levels: " + two_level in log
        else:
            assert "allgather in two levels" not in log
    first = hier[0][0]
    for name, value in first.items():
        for other, _ in hier[1:] + flat:
            assert other[name].dtype == value.dtype and other[name].shape == value.shape, name
            assert other[name].tobytes() == value.tobytes(), name
        np.testing.assert_array_equal(value, _ag_reference(name, n))
