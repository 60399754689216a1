"""hvdlite.tensorflow collectives on real processes: every collective and
dtype against a NumPy reference, eagerly and inside tf.function, grouped
forms, compression, IndexedSlices, process sets and error cases. One job per
world size runs every check (TensorFlow's import dominates)."""

import numpy as np
import pytest
from helpers import TF_SPAWN_ENV, run_pooled

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}  # TensorFlow's start-up chatter off in the ranks

DTYPES = ["uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = ["Sum", "Average", "Min", "Max", "Product"]
SHAPES = [(0,), (1,), (7,), (3, 5)]


def _values(dtype, op, shape, rank):
    idx = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    raw = (idx + rank) % 2 + 1 if op == "Product" else (idx * 3 + rank * 5) % 9
    return raw.astype(np.float64)


def _reference(op, shape, size, integer):
    stack = np.stack([_values(None, op, shape, r) for r in range(size)])
    if op in ("Sum", "Average"):
        out = stack.sum(0) / (size if op == "Average" else 1)
        return np.trunc(out) if integer else out
    return stack.prod(0) if op == "Product" else (stack.min(0) if op == "Min" else stack.max(0))


def _allreduce_checks(hvd, tf, graph):
    """Every dtype x op x shape (in graph mode: all in one tf.function);
    returns the raw bytes of each result."""
    cases = [(dtype, op, shape) for dtype in DTYPES for op in OPS for shape in SHAPES]

    def run():
        return [
            hvd.allreduce(
                tf.cast(_values(d, op, shape, hvd.rank()), getattr(tf, d)),
                op=getattr(hvd, op),
                name="ar.%s.%s.%s" % (d, op, shape),
            )
            for d, op, shape in cases
        ]

    outs = tf.function(run)() if graph else run()
    result = {}
    for (dtype, op, shape), y in zip(cases, outs):
        assert y.dtype == getattr(tf, dtype) and tuple(y.shape) == shape, (dtype, op, shape)
        want = _reference(op, shape, hvd.size(), not y.dtype.is_floating)
        np.testing.assert_allclose(
            tf.cast(y, tf.float64).numpy(), want, rtol=1e-2, err_msg=str((dtype, op, shape))
        )
        result[(dtype, op, shape)] = y.numpy().tobytes()
    return result


def _part(k):
    return (np.arange((0 if k == 1 else k + 2) * 3).reshape(-1, 3) + 10 * k) % 7


def _other_compute(hvd, tf):
    """Allgather (uneven, one empty), broadcast from every root, alltoall and
    reducescatter of every dtype, and an alltoall with splits."""
    r, n = hvd.rank(), hvd.size()
    out = {}
    for dtype in DTYPES + ["bool"]:
        tf_dtype = getattr(tf, dtype)
        out["ag." + dtype] = hvd.allgather(tf.cast(_part(r), tf_dtype), name="ag.%s" % dtype)
        for root in range(n):
            out["bc.%s.%d" % (dtype, root)] = hvd.broadcast(
                tf.cast((np.arange(11) + root * 3 + r) % 5, tf_dtype), root, name="bc.%s.%d" % (dtype, root)
            )
        even = tf.cast(np.arange(2 * n * 3).reshape(2 * n, 3) + 100 * r, tf_dtype)
        out["a2a." + dtype] = hvd.alltoall(even, name="a2a.%s" % dtype)
        if dtype != "bool":
            rs = tf.cast(np.full((2 * n + 1, 2), r + 1), tf_dtype)
            out["rs." + dtype] = hvd.reducescatter(rs, op=hvd.Sum, name="rs.%s" % dtype)
    splits = [(r + j) % 3 for j in range(n)]
    x = tf.constant(np.repeat(np.arange(n) * 100 + r, splits).reshape(-1, 1).astype(np.float32))
    out["a2a_splits"] = hvd.alltoall(x, splits=tf.constant(splits), name="a2a.splits")
    return out


def _other_checks(hvd, tf, graph):
    r, n = hvd.rank(), hvd.size()
    out = tf.function(lambda: _other_compute(hvd, tf))() if graph else _other_compute(hvd, tf)
    for dtype in DTYPES + ["bool"]:
        tf_dtype = getattr(tf, dtype)
        got = out["ag." + dtype]
        assert got.dtype == tf_dtype
        np.testing.assert_array_equal(
            got.numpy(), tf.cast(np.concatenate([_part(k) for k in range(n)]), tf_dtype)
        )
        for root in range(n):
            want = tf.cast((np.arange(11) + root * 4) % 5, tf_dtype).numpy()
            np.testing.assert_array_equal(out["bc.%s.%d" % (dtype, root)].numpy(), want)
        got = out["a2a." + dtype]  # without splits: the output only (Horovod's)
        want = np.concatenate(
            [np.arange(2 * n * 3).reshape(2 * n, 3)[2 * r : 2 * r + 2] + 100 * k for k in range(n)]
        )
        np.testing.assert_array_equal(got.numpy(), tf.cast(want, tf_dtype).numpy())
        if dtype != "bool":
            mine = (2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0)
            want = tf.cast(np.full((mine, 2), n * (n + 1) // 2), tf_dtype)
            np.testing.assert_array_equal(out["rs." + dtype].numpy(), want)
    got, received = out["a2a_splits"]
    want_rows = [(j + r) % 3 for j in range(n)]
    assert received.dtype == tf.int32 and received.numpy().tolist() == want_rows
    assert (
        got[:, 0].numpy().tolist() == np.repeat(r * 100 + np.arange(n), want_rows).astype(np.float32).tolist()
    )


def _grouped_and_options(hvd, tf):
    r, n = hvd.rank(), hvd.size()
    tensors = [tf.fill([5], float(r + i)) for i in range(4)]
    for got, i in zip(hvd.grouped_allreduce(tensors, op=hvd.Sum), range(4)):
        np.testing.assert_allclose(got.numpy(), sum(k + i for k in range(n)))
    gathered = tf.function(lambda ts: hvd.grouped_allgather(ts))([tf.fill([r + 1, 2], r), tf.fill([1], r)])
    assert gathered[0].shape[0] == n * (n + 1) // 2 and gathered[1].numpy().tolist() == list(range(n))
    scattered = hvd.grouped_reducescatter([tf.ones([2 * n, 3]), tf.ones([n])], op=hvd.Sum)
    assert scattered[0].numpy().tolist() == [[n] * 3] * 2 and scattered[1].numpy().tolist() == [n]
    half = hvd.allreduce(tf.constant([1.5, 2.5], tf.float32), compression=hvd.Compression.fp16)
    assert half.dtype == tf.float32 and half.numpy().tolist() == [1.5, 2.5]
    brain = hvd.allreduce(tf.constant([1.5, 2.5], tf.float32), compression=hvd.Compression.bf16)
    assert brain.dtype == tf.float32 and brain.numpy().tolist() == [1.5, 2.5]
    scaled = hvd.allreduce(tf.ones([4]), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert scaled.numpy().tolist() == [float(n)] * 4
    assert hvd.allreduce(tf.ones([2]), average=False).numpy().tolist() == [float(n)] * 2
    sparse = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]), tf.constant([n, 2]))
    reduced = hvd.allreduce(sparse, op=hvd.Sum)
    assert isinstance(reduced, tf.IndexedSlices) and reduced.indices.numpy().tolist() == list(range(n))
    dense = tf.convert_to_tensor(reduced).numpy()
    assert dense[:, 0].tolist() == [float(k + 1) for k in range(n)]
    assert hvd.broadcast_object({"rank": r} if r == 0 else None) == {"rank": 0}
    assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]
    v = tf.Variable(tf.fill([3], float(r)))
    hvd.broadcast_variables([v], root_rank=n - 1)
    assert v.numpy().tolist() == [float(n - 1)] * 3
    hvd.barrier()


def _error_checks(hvd, tf):
    r = hvd.rank()
    errors = {}
    for key, call in [
        ("dtype", lambda: hvd.allreduce(tf.constant(["a"]))),
        ("shape", lambda: hvd.allreduce(tf.ones([2 + r]), name="mismatch")),
        ("graph_shape", lambda: tf.function(lambda: hvd.allreduce(tf.ones([2 + r]), name="gmismatch"))()),
        ("splits", lambda: hvd.alltoall(tf.ones([3]), splits=[1, 5])),
        (
            "sparse_max",
            lambda: hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0])), op=hvd.Max),
        ),
        ("scalar_a2a", lambda: hvd.alltoall(tf.constant(1.0))),
        (
            "predivide",
            lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0),
        ),
    ]:
        try:
            call()
            errors[key] = None
        except Exception as exc:
            tf_error = type(exc).__name__ if isinstance(exc, tf.errors.OpError) else None
            errors[key] = (type(exc).__name__, isinstance(exc, (hvd.HvdliteError, ValueError)), tf_error)
    return errors


def _join_adasum_and_queries(hvd, tf):
    """join(): rank 0 reduces once more while the others have joined (they add zeros);
    Adasum of equal vectors on 1 or 2 ranks is that vector and fails on 3 (not a power of two);
    capability queries."""
    r, n = hvd.rank(), hvd.size()
    if r == 0:
        assert hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="after.join").numpy().tolist() == [1.0, 1.0]
    assert hvd.join() == 0 or n == 1
    if n in (1, 2):
        assert hvd.allreduce(tf.constant([3.0]), op=hvd.Adasum, name="adasum").numpy().tolist() == [3.0]
    else:
        try:
            hvd.allreduce(tf.constant([3.0]), op=hvd.Adasum, name="adasum")
            raise AssertionError("Adasum on 3 ranks did not fail")
        except NotImplementedError:
            pass
    assert hvd.gloo_built() and not hvd.rocm_built() and hvd.is_initialized()
    assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == (r, n, 0, 1)


def _job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    tf.get_logger().setLevel("ERROR")
    hvd.init()
    out = {"eager": _allreduce_checks(hvd, tf, False), "graph": _allreduce_checks(hvd, tf, True)}
    _other_checks(hvd, tf, False)
    _other_checks(hvd, tf, True)
    _grouped_and_options(hvd, tf)
    if hvd.size() == 3:
        ps = hvd.add_process_set([0, 2])
        if ps.included():
            got = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum, process_set=ps)
            assert got.numpy().tolist() == [2.0]
            assert hvd.allgather(tf.constant([hvd.rank()]), process_set=ps).numpy().tolist() == [0, 2]
    out["errors"] = _error_checks(hvd, tf)
    _join_adasum_and_queries(hvd, tf)
    hvd.shutdown()
    return out


@pytest.mark.parametrize(
    "size", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)]
)
def test_every_collective_dtype_eager_and_tf_function(size):
    results = run_pooled(_job, size, timeout=240, env=TF_ENV, spawn_env=TF_SPAWN_ENV)
    for key in ("eager", "graph"):
        for name, data in results[0][key].items():
            assert all(res[key][name] == data for res in results), "ranks disagree on %s" % name
    errors = results[0]["errors"]
    assert errors["dtype"] == ("NotSupportedError", True, None)
    assert errors["scalar_a2a"][1] and errors["predivide"][1]
    # Horovod's TensorFlow errors: bad arguments are tf InvalidArgumentError, ranks that
    # disagree tf FailedPreconditionError (eagerly also hvdlite's MismatchError).
    assert errors["splits"] == ("InvalidArgumentError", True, "InvalidArgumentError"), errors
    assert errors["sparse_max"] == ("NotSupportedError", True, None), errors
    if size > 1:
        assert errors["shape"] == ("MismatchError", True, "MismatchError"), errors
        assert errors["graph_shape"][2] == "FailedPreconditionError", errors
