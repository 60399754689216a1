"""Every collective on 1-4 real processes, every dtype and op, against a NumPy
reference computed here in the parent; every rank must return the same bytes."""

import ml_dtypes
import numpy as np
import pytest
from helpers import run_pooled

DTYPES = [
    np.uint8,
    np.int8,
    np.uint16,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
]
OPS = ["Sum", "Average", "Min", "Max", "Product"]
COUNTS = [0, 1, 7, 1000]
WORLD_SIZES = [1, 2, 3, 4]


def _values(dtype, op, count, rank):
    """Small integers, so every reduction is exact in every dtype."""
    idx = np.arange(count)
    raw = (idx + rank) % 2 + 1 if op == "Product" else (idx * 3 + rank * 5) % 9
    return raw.astype(dtype)


def _reference(dtype, op, count, size):
    stack = np.stack([_values(dtype, op, count, r).astype(np.float64) for r in range(size)])
    if op in ("Sum", "Average"):
        out = stack.sum(axis=0)
        if op == "Average":
            out = out * (1.0 / size)
            if np.issubdtype(np.dtype(dtype), np.integer):
                out = np.trunc(out)
    elif op == "Product":
        out = stack.prod(axis=0)
    else:
        out = getattr(stack, op.lower())(axis=0)
    return out.astype(dtype)


def _allreduce_matrix():
    import hvdlite as hvd

    hvd.init()
    out = {}
    for dtype in DTYPES:
        for op in OPS:
            for count in COUNTS:
                x = _values(dtype, op, count, hvd.rank())
                key = (np.dtype(dtype).name, op, count)
                out[key] = hvd.allreduce(x, op=getattr(hvd, op), name="ar.%s.%s.%d" % key).tobytes()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_allreduce_every_dtype_op_and_count(size):
    results = run_pooled(_allreduce_matrix, size, timeout=120)
    for key, got in results[0].items():
        assert all(r[key] == got for r in results), "ranks disagree on %s" % (key,)
        dtype_name, op, count = key
        dtype = next(d for d in DTYPES if np.dtype(d).name == dtype_name)
        want = _reference(dtype, op, count, size)
        assert np.frombuffer(got, dtype=dtype).tolist() == want.tolist(), key


def _random_floats(seed_base):
    import hvdlite as hvd

    hvd.init()
    rng = np.random.default_rng(seed_base + hvd.rank())
    out = {}
    for dtype in (np.float32, np.float64):
        for count in (5, 100003):
            x = rng.standard_normal(count).astype(dtype)
            out[(np.dtype(dtype).name, count)] = (
                x,
                hvd.allreduce(x, op=hvd.Average, name="rf.%d" % count + np.dtype(dtype).name),
            )
    hvd.shutdown()
    return out


@pytest.mark.parametrize("size", [2, 3])
def test_allreduce_random_floats_bitwise_identical(size):
    results = run_pooled(_random_floats, size, args=(17,), timeout=90)
    for key in results[0]:
        outs = [r[key][1] for r in results]
        assert all(o.tobytes() == outs[0].tobytes() for o in outs), key
        want = np.mean([r[key][0].astype(np.float64) for r in results], axis=0)
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-6)


def _other_collectives():
    import hvdlite as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    for dtype in DTYPES + [np.bool_]:
        name = np.dtype(dtype).name
        rows = 0 if r == 1 else r + 2  # rank 1 contributes nothing
        x = ((np.arange(rows * 3).reshape(rows, 3) + 10 * r) % 7).astype(dtype)
        out[("allgather", name)] = hvd.allgather(x, name="ag." + name)
        for root in range(n):
            y = ((np.arange(11) + root * 3 + r) % 5).astype(dtype)
            out[("broadcast", name, root)] = hvd.broadcast(y, root, name="bc.%s.%d" % (name, root))
    # alltoall: member r sends (r + j) % 3 rows to member j
    splits = [(r + j) % 3 for j in range(n)]
    x = np.repeat(np.arange(n) * 100 + r, splits).reshape(-1, 1).astype(np.int64) * np.ones((1, 2), np.int64)
    out["alltoall"] = hvd.alltoall(x, splits=splits, name="a2a")
    out["alltoall_even"] = hvd.alltoall(np.full((2 * n, 1), r, np.float32), name="a2a.even")
    for rows in (0, 1, 7):
        x = (np.arange(rows * 2).reshape(rows, 2) + r).astype(np.float32)
        out[("reducescatter", rows)] = hvd.reducescatter(x, op=hvd.Sum, name="rs.%d" % rows)
    out["reducescatter_avg"] = hvd.reducescatter(np.full((n * 2, 3), r + 1, np.float64), name="rs.avg")
    out["scaled"] = hvd.allreduce(
        np.ones(4, np.float32), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, name="scaled"
    )
    out["grouped"] = hvd.grouped_allreduce(
        [np.full(3, r, np.float64), np.full((2, 2), 1, np.int32)], op=hvd.Sum
    )
    hvd.shutdown()
    return out


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_allgather_broadcast_alltoall_reducescatter(size):
    results = run_pooled(_other_collectives, size, timeout=120)
    n = size
    for key in results[0]:
        a = results[0][key]
        for other in results[1:]:
            b = other[key]
            if (
                key == "alltoall"
                or key == "alltoall_even"
                or key[0] == "reducescatter"
                or key == "reducescatter_avg"
            ):
                continue  # per-rank results, checked below
            if isinstance(a, list):
                assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b)), key
            else:
                assert a.tobytes() == b.tobytes() and a.shape == b.shape, key
    for dtype in DTYPES + [np.bool_]:
        name = np.dtype(dtype).name
        parts = [
            ((np.arange((0 if r == 1 else r + 2) * 3).reshape(-1, 3) + 10 * r) % 7).astype(dtype)
            for r in range(n)
        ]
        np.testing.assert_array_equal(results[0][("allgather", name)], np.concatenate(parts))
        assert results[0][("allgather", name)].dtype == np.dtype(dtype)
        for root in range(n):
            want = ((np.arange(11) + root * 3 + root) % 5).astype(dtype)
            np.testing.assert_array_equal(results[-1][("broadcast", name, root)], want)
    for r, res in enumerate(results):
        out, received = res["alltoall"]
        want_rows = [(j + r) % 3 for j in range(n)]
        assert received.tolist() == want_rows
        np.testing.assert_array_equal(out[:, 0], np.repeat(r * 100 + np.arange(n), want_rows))
        assert out.shape == (sum(want_rows), 2)
        np.testing.assert_array_equal(
            res["alltoall_even"][:, 0], np.repeat(np.arange(n), 2).astype(np.float32)
        )
        for rows in (0, 1, 7):
            total = sum((np.arange(rows * 2).reshape(rows, 2) + k).astype(np.float32) for k in range(n))
            mine = rows // n + (1 if r < rows % n else 0)
            start = sum(rows // n + (1 if k < rows % n else 0) for k in range(r))
            np.testing.assert_array_equal(res[("reducescatter", rows)], total[start : start + mine])
        np.testing.assert_allclose(res["reducescatter_avg"], np.full((2, 3), (n + 1) / 2.0))
        np.testing.assert_array_equal(res["scaled"], np.full(4, n, np.float32))
        np.testing.assert_array_equal(res["grouped"][0], np.full(3, n * (n - 1) / 2))
        np.testing.assert_array_equal(res["grouped"][1], np.full((2, 2), n, np.int32))


def _async_and_inplace():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    arrays = [np.full(1000, r + i, np.float32) for i in range(20)]
    handles = [hvd.allreduce_async_(a, op=hvd.Sum, name="async.%d" % i) for i, a in enumerate(arrays)]
    polled = [hvd.poll(h) for h in handles]
    outs = [hvd.synchronize(h) for h in handles]
    same_objects = all(o is a for o, a in zip(outs, arrays))
    strided = np.zeros((4, 6), np.float64)
    strided[:, ::2] = r + 1
    view = strided[:, ::2]  # not contiguous: written back on completion
    hvd.allreduce_(view, op=hvd.Sum, name="strided")
    unnamed = [hvd.allreduce(np.ones(2) * r, op=hvd.Max) for _ in range(3)]
    hvd.barrier()
    hvd.shutdown()
    return [a[0] for a in arrays], same_objects, all(isinstance(p, bool) for p in polled), strided, unnamed


def test_async_inplace_noncontiguous_and_unnamed():
    results = run_pooled(_async_and_inplace, 2, timeout=60)
    for firsts, same, polled_ok, strided, unnamed in results:
        assert firsts == [1 + 2 * i for i in range(20)]
        assert same and polled_ok
        np.testing.assert_array_equal(strided[:, ::2], np.full((4, 3), 3.0))
        np.testing.assert_array_equal(strided[:, 1::2], np.zeros((4, 3)))
        assert all(u.tolist() == [1.0, 1.0] for u in unnamed)


# Horovod's scaling rule (its ScaleBufferCPUImpl): integers in float64 then truncated toward
# zero, float16 / bfloat16 / float32 in float32 with the factor first rounded to float32,
# float64 in float64. Average is Sum with postscale / size (computed in double).
SCALED_FACTORS = [(0.3071, 1.0), (1.0, 0.5871), (0.1, 3.7), (2.5, 0.4)]


def _horovod_scale(x, factor, dtype):
    if np.issubdtype(np.dtype(dtype), np.integer):
        return np.trunc(x.astype(np.float64) * factor).astype(dtype)
    if np.dtype(dtype) == np.float64:
        return x * factor
    return (x.astype(np.float32) * np.float32(factor)).astype(dtype)


def _scaled_inputs(dtype, rank):
    """Integers small enough that no scaled value or sum leaves int8's range (Horovod's cast
    of an out-of-range double is undefined behaviour; hvdlite saturates)."""
    rng = np.random.default_rng(1234 + rank)
    low = 0 if np.dtype(dtype).kind == "u" else -15
    values = rng.integers(low, 16, 37).astype(np.float64)
    if np.dtype(dtype).kind == "f":
        values += rng.uniform(size=37)  # fractions, so the rounding of each product shows
    return values.astype(dtype)


def _scaled_allreduces():
    import hvdlite as hvd

    hvd.init()
    out = {}
    for dtype in DTYPES:
        x = _scaled_inputs(dtype, hvd.rank())
        for i, (pre, post) in enumerate(SCALED_FACTORS):
            for op in ("Sum", "Average"):
                key = (np.dtype(dtype).name, i, op)
                out[key] = hvd.allreduce(
                    x,
                    op=getattr(hvd, op),
                    prescale_factor=pre,
                    postscale_factor=post,
                    name="sc.%s.%d.%s" % key,
                )
    hvd.shutdown()
    return out


def test_prescale_postscale_round_as_horovod_does():
    size = 2  # a two-term sum is one correctly rounded addition in every dtype, as in NumPy
    results = run_pooled(_scaled_allreduces, size, timeout=120)
    for key, got in results[0].items():
        dtype = next(d for d in DTYPES if np.dtype(d).name == key[0])
        pre, post = SCALED_FACTORS[key[1]]
        if key[2] == "Average":
            post = post / size
        scaled = [_horovod_scale(_scaled_inputs(dtype, r), pre, dtype) for r in range(size)]
        if np.issubdtype(np.dtype(dtype), np.integer):
            total = (scaled[0].astype(np.int64) + scaled[1]).astype(dtype)
        else:
            total = (scaled[0].astype(np.float32) + scaled[1].astype(np.float32)).astype(dtype)
            if np.dtype(dtype) == np.float64:
                total = scaled[0] + scaled[1]
        want = _horovod_scale(total, post, dtype)
        assert got.dtype == np.dtype(dtype), key
        assert got.tobytes() == want.tobytes(), (key, got, want)
        assert results[1][key].tobytes() == got.tobytes(), key
