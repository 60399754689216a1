"""hvdlite.tensorflow against Horovod 0.28.1's semantics, public name by public name
(as tests/test_parity_torch.py does for horovod.torch).

Each ``Test*`` class covers the horovod.tensorflow names given to its ``@covers(...)``:
values, exception types (Horovod's TensorFlow raises tf.errors.FailedPreconditionError when
ranks disagree and tf.errors.InvalidArgumentError for a bad argument) and graph-mode
behaviour. The parts that need a job run once per file, on 2 real ranks (``job`` fixture,
tests/parity_tf.py); the tests then judge the results.

Every name of horovod.tensorflow (tests/data/horovod_0.28.1_api.json) is covered by a class
here or listed in NOT_YET_HERE with the reason (checked both ways, so the list only shrinks).
"""

import pytest
from helpers import TF_SPAWN_ENV, run_pooled
from parity_tf import COVERED, HOROVOD_TF_NAMES, by_rank, covers, err, job_fixture

tf = pytest.importorskip("tensorflow")

job = job_fixture(__name__)

_ELSEWHERE = "covered by tests/test_tf_*.py, not yet organised by name here"
NOT_YET_HERE = {
    name: _ELSEWHERE
    for name in [
        "Adasum",
        "Average",
        "Compression",
        "DistributedGradientTape",
        "DistributedOptimizer",
        "Max",
        "Min",
        "PartialDistributedGradientTape",
        "Product",
        "Sum",
        "add_process_set",
        "allgather",
        "allgather_object",
        "broadcast_object",
        "broadcast_variables",
        "ccl_built",
        "cross_rank",
        "cross_size",
        "cuda_built",
        "ddl_built",
        "global_process_set",
        "gloo_built",
        "gloo_enabled",
        "grouped_reducescatter",
        "init",
        "is_initialized",
        "join",
        "local_rank",
        "local_size",
        "mpi_built",
        "mpi_enabled",
        "mpi_threads_supported",
        "nccl_built",
        "rank",
        "reducescatter",
        "remove_process_set",
        "rocm_built",
        "shutdown",
        "size",
        "start_timeline",
        "stop_timeline",
        "elastic",
    ]
}


def _values(fn, tf):
    """fn()'s value eagerly and inside a tf.function."""
    return [int(fn().numpy()), int(tf.function(fn)().numpy())]


@covers("rank_op", "size_op", "local_rank_op", "local_size_op", "process_set_included_op")
class TestQueryOps:
    """int32 scalar tensors read when the op runs; process_set_included_op gives 1/0, -2 for
    an unknown set."""

    @staticmethod
    def on_rank(hvd, tf):
        return {
            "rank": _values(hvd.rank_op, tf),
            "size": _values(hvd.size_op, tf),
            "local_rank": _values(hvd.local_rank_op, tf),
            "local_size": _values(hvd.local_size_op, tf),
            "included": _values(hvd.process_set_included_op, tf),
            "unknown_set": int(hvd.process_set_included_op(process_set_id=12345).numpy()),
            "dtype": hvd.size_op().dtype.name,
        }

    def test_values(self, job):
        for r, got in enumerate(by_rank(job, TestQueryOps)):
            assert got["rank"] == [r, r] and got["size"] == [2, 2]
            assert got["local_rank"] == [r, r] and got["local_size"] == [2, 2]
            assert got["included"] == [1, 1] and got["unknown_set"] == -2
            assert got["dtype"] == "int32"


def _broadcast_grad_in_graph(hvd, tf):
    """tf.gradients through broadcast in a TF1 graph, only the gradient fetched."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.ones([3]) * hvd.rank()
        grad = tf.gradients(hvd.broadcast(x, 0, name="p.bgrad"), x, tf.ones([3]))[0]
        with tf.compat.v1.Session(graph=graph) as sess:
            return sess.run(grad).tolist()


@covers("allreduce", "alltoall", "broadcast")
class TestErrors:
    """Ranks that disagree: tf.errors.FailedPreconditionError (eagerly also hvdlite's
    MismatchError), in eager and graph mode; bad splits: tf.errors.InvalidArgumentError;
    IndexedSlices with Max or a prescale: NotImplementedError."""

    @staticmethod
    def on_rank(hvd, tf):
        r = hvd.rank()
        sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), dense_shape=tf.constant([2, 2]))
        return {
            "shape": err(lambda: hvd.allreduce(tf.ones([2 + r]), name="p.shape")),
            "dtype": err(lambda: hvd.allreduce(tf.ones([2], dtype=[tf.float32, tf.int32][r]), name="p.dt")),
            "graph_shape": err(tf.function(lambda: hvd.allreduce(tf.ones([2 + r]), name="p.gshape"))),
            "root": err(lambda: hvd.broadcast(tf.ones([2]), root_rank=r, name="p.root")),
            "splits": err(lambda: hvd.alltoall(tf.ones([3]), splits=[1, 5], name="p.splits")),
            "graph_splits": err(
                tf.function(lambda: hvd.alltoall(tf.ones([3]), splits=[1, 5], name="p.gsplits"))
            ),
            "sparse_max": err(lambda: hvd.allreduce(sparse, op=hvd.Max)),
            "sparse_prescale": err(lambda: hvd.allreduce(sparse, op=hvd.Sum, prescale_factor=2.0)),
            # a scalar in a grouped reducescatter crashed the process (SIGSEGV) before the check
            "grouped_rs_scalar": err(lambda: hvd.grouped_reducescatter([tf.zeros((2, 1)), tf.constant(1.0)])),
            "bcast_grad": _broadcast_grad_in_graph(hvd, tf),
            "after": hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="p.after").numpy().tolist(),
        }

    def test_mismatch_is_failed_precondition(self, job):
        for got in by_rank(job, TestErrors):
            for key in ("shape", "dtype", "root"):
                _, mro, _ = got[key]
                assert "FailedPreconditionError" in mro and "MismatchError" in mro, (key, mro)
            assert got["graph_shape"][0] == "FailedPreconditionError", got["graph_shape"]
            assert got["after"] == [2.0, 2.0]  # the job goes on

    def test_bad_argument_is_invalid_argument(self, job):
        for got in by_rank(job, TestErrors):
            assert "InvalidArgumentError" in got["splits"][1] and "OpError" in got["splits"][1]
            assert got["graph_splits"][0] == "InvalidArgumentError"
            assert "ValueError" in got["grouped_rs_scalar"][1]

    def test_broadcast_gradient_in_a_graph(self, job):
        # root: ones; the other rank: zeros (and its allreduce still runs: it used to be
        # pruned from the graph there, and the root waited forever)
        assert [got["bcast_grad"] for got in by_rank(job, TestErrors)] == [[1.0] * 3, [0.0] * 3]

    def test_sparse_limits_are_not_implemented(self, job):
        for got in by_rank(job, TestErrors):
            assert "NotImplementedError" in got["sparse_max"][1]
            assert "NotImplementedError" in got["sparse_prescale"][1]


@covers("broadcast_", "broadcast_global_variables", "broadcast_object_fn")
class TestBroadcastVariables:
    """broadcast_: in place, returns the values read after; broadcast_global_variables:
    TF1 graphs only (eagerly a RuntimeError, as in Horovod); broadcast_object_fn: a function."""

    @staticmethod
    def on_rank(hvd, tf):
        r = hvd.rank()
        var = tf.Variable([float(r), 1.0])
        (read,) = hvd.broadcast_([var], root_rank=1)
        graph = tf.Graph()
        with graph.as_default():
            gvar = tf.compat.v1.Variable([float(r + 5)])
            bcast = hvd.broadcast_global_variables(0)
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(bcast)
                global_value = sess.run(gvar).tolist()
        return {
            "read": read.numpy().tolist(),
            "var": var.numpy().tolist(),
            "global": global_value,
            "eager_global": err(lambda: hvd.broadcast_global_variables(0)),
            "object": hvd.broadcast_object_fn(root_rank=1)({"r": r}),
        }

    def test_values(self, job):
        for got in by_rank(job, TestBroadcastVariables):
            assert got["read"] == [1.0, 1.0] and got["var"] == [1.0, 1.0]
            assert got["global"] == [5.0]
            assert "RuntimeError" in got["eager_global"][1]
            assert got["object"] == {"r": 1}


@covers("grouped_allgather", "grouped_allreduce")
class TestGroupedInGraphs:
    """One tf.gradients call per output of a grouped allgather (several backward passes of
    one op in one graph, each with its own names); grouped_allreduce takes IndexedSlices
    without dense_shape (allgathered, as allreduce does); alltoall's gradient in a graph."""

    @staticmethod
    def on_rank(hvd, tf):
        r = hvd.rank()

        @tf.function
        def gather_grads():
            ts = [tf.ones([2 + r, 3]) * r for _ in range(3)]
            outs = hvd.grouped_allgather(ts, name="p.gg")
            return [tf.gradients(o, t)[0] for o, t in zip(outs, ts)]

        @tf.function
        def alltoall_grad():
            x = tf.range(4, dtype=tf.float32) + 10 * r
            with tf.GradientTape() as tape:
                tape.watch(x)
                y, received = hvd.alltoall(x, splits=tf.constant([1, 3]), name="p.a2a")
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, x), received

        sparse = tf.IndexedSlices(tf.ones([1, 2]) * (r + 1), tf.constant([r]))
        out = hvd.grouped_allreduce([sparse, tf.ones([2])], op=hvd.Sum, name="p.gs")
        grad, received = alltoall_grad()
        return {
            "gather_grads": [g.numpy().tolist() for g in gather_grads()],
            "sparse": [
                type(out[0]).__name__,
                out[0].values.numpy().tolist(),
                out[0].indices.numpy().tolist(),
            ],
            "dense": out[1].numpy().tolist(),
            "a2a_grad": grad.numpy().tolist(),
            "received": [received.dtype.name, received.numpy().tolist()],
        }

    def test_values(self, job):
        for r, got in enumerate(by_rank(job, TestGroupedInGraphs)):
            # every rank passes ones upstream; ALLGATHER_GRAD_OP (Average, as Horovod) keeps them
            assert got["gather_grads"] == [[[1.0] * 3] * (2 + r)] * 3
            assert got["sparse"] == ["IndexedSlices", [[1.0, 1.0], [2.0, 2.0]], [0, 1]]
            assert got["dense"] == [2.0, 2.0]
            assert got["a2a_grad"] == [2.0 * (v + 10 * r) for v in range(4)]
            assert got["received"] == ["int32", [1, 1] if r == 0 else [3, 3]]


@covers("SyncBatchNormalization")
class TestSyncBatchNormalization:
    """Training-mode statistics over every rank's batch: rank r's one-row output equals row
    r of a plain BatchNormalization over the stacked rows; fused= (Keras 2) is accepted."""

    @staticmethod
    def on_rank(hvd, tf):
        import numpy as np

        keras = tf.keras
        r, n = hvd.rank(), hvd.size()
        x = np.stack([np.array([[i, i + 1], [i * 2, i * 2 + 1]], np.float32) for i in range(n)])
        bn = keras.layers.BatchNormalization(axis=1)
        sync_bn = hvd.SyncBatchNormalization(axis=1, fused=False)
        want = bn(tf.constant(x), training=True).numpy()[r]
        got = sync_bn(tf.constant(x[r : r + 1]), training=True).numpy()[0]
        return {
            "out": bool(np.allclose(got, want, atol=1e-5)),
            "moving_mean": bool(np.allclose(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy())),
            "moving_variance": bool(np.allclose(sync_bn.moving_variance.numpy(), bn.moving_variance.numpy())),
        }

    def test_matches_batch_norm_over_all_ranks(self, job):
        for got in by_rank(job, TestSyncBatchNormalization):
            assert got == {"out": True, "moving_mean": True, "moving_variance": True}


@covers("vars_to_refs", "refs_to_vars")
class TestRefs:
    def test_round_trip(self):
        import hvdlite.tensorflow as hvd

        a, b = tf.Variable(1.0), tf.Variable(2.0)
        refs = hvd.vars_to_refs([a, [b]])
        assert hash(refs) is not None
        back = hvd.refs_to_vars(refs)
        assert back[0] is a and back[1][0] is b


@covers("BroadcastGlobalVariablesHook")
class TestBroadcastGlobalVariablesHook:
    """A tf.compat.v1 SessionRunHook: a monitored session starts with root_rank's global
    variables; the hook rebuilds its op for a new graph."""

    @staticmethod
    def on_rank(hvd, tf):
        hook = hvd.BroadcastGlobalVariablesHook(1)
        values = []
        for offset in (5.0, 7.0):  # two graphs, one hook
            with tf.Graph().as_default():
                var = tf.compat.v1.Variable([float(hvd.rank()) + offset])
                with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as sess:
                    values.append(sess.run(var).tolist())
        return {"values": values, "is_hook": isinstance(hook, tf.compat.v1.train.SessionRunHook)}

    def test_values(self, job):
        for got in by_rank(job, TestBroadcastGlobalVariablesHook):
            assert got["values"] == [[6.0], [8.0]] and got["is_hook"]


@covers("LocalGradientAggregationHelper")
class TestLocalGradientAggregation:
    """DistributedOptimizer(tf.compat.v1 optimizer, backward_passes_per_step=2) in a graph, through
    LocalGradientAggregationHelper: gradients are summed locally, averaged across ranks every
    second run (then divided by 2, average_aggregated_gradients) and applied only then; the
    global step advances every run. Eagerly it is refused with a ValueError, as in Horovod."""

    @staticmethod
    def on_rank(hvd, tf):
        r = hvd.rank()
        trace = []
        with tf.Graph().as_default():
            var = tf.compat.v1.Variable([0.0])
            step = tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False)
            opt = hvd.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(1.0),
                backward_passes_per_step=2,
                average_aggregated_gradients=True,
            )
            pairs = opt.compute_gradients(var * float(r + 1), [var])
            train = opt.apply_gradients(pairs, global_step=step)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(tf.compat.v1.local_variables_initializer())
                for _ in range(4):
                    sess.run(train)
                    trace.append([sess.run(var).tolist()[0], int(sess.run(step))])
        eager = err(
            lambda: hvd.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2
            )
        )
        return {"trace": trace, "eager": eager}

    def test_values(self, job):
        for got in by_rank(job, TestLocalGradientAggregation):
            # mean over ranks of (r + 1) is 1.5; summed over 2 passes and divided by 2: 1.5 a step.
            assert got["trace"] == [[0.0, 1], [-1.5, 2], [-1.5, 3], [-3.0, 4]]
            assert "ValueError" in got["eager"][1] and "backward_passes_per_step" in got["eager"][2]


@covers(
    "is_homogeneous",
    "check_num_rank_power_of_2",
    "handle_average_backwards_compatibility",
    "split_list",
    "gpu_available",
    "check_extension",
)
class TestHorovodUtilNames:
    """is_homogeneous (one host: True) and the horovod.common.util helpers horovod.tensorflow
    re-exports; horovod.tensorflow.mpi_ops carries the same objects."""

    @staticmethod
    def on_rank(hvd, tf):
        return {"homogeneous": hvd.is_homogeneous()}

    def test_values(self, job):
        assert [got["homogeneous"] for got in by_rank(job, TestHorovodUtilNames)] == [True, True]

    def test_helpers(self):
        import warnings

        import hvdlite.tensorflow as hvd
        import hvdlite.tensorflow.mpi_ops as mpi_ops

        assert [hvd.check_num_rank_power_of_2(n) for n in (0, 1, 2, 3, 4, 6, 8)] == [
            False, True, True, False, True, False, True
        ]  # fmt: skip
        handle = hvd.handle_average_backwards_compatibility
        assert handle(None, None) == hvd.Average and handle(hvd.Max, None) == hvd.Max
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert handle(None, False) == hvd.Sum and handle(None, True) == hvd.Average
        assert all(issubclass(w.category, DeprecationWarning) for w in caught) and len(caught) == 2
        assert "ValueError" in err(lambda: handle(hvd.Sum, True))[1]
        assert hvd.split_list([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
        assert hvd.gpu_available("tensorflow") == bool(tf.config.list_physical_devices("GPU"))
        assert (
            hvd.check_extension("horovod.tensorflow", "HOROVOD_WITH_TENSORFLOW", __file__, "mpi_lib") is None
        )
        for name in (
            "is_homogeneous",
            "rank_op",
            "init",
            "Average",
            "handle_average_backwards_compatibility",
        ):
            assert getattr(mpi_ops, name) is getattr(hvd, name), name


@covers("ProcessSet")
class TestProcessSetsInTensorFlow:
    """A set id the core does not know fails when the op is built with a ValueError (Horovod's);
    a rank outside a tape's or v1 optimizer's process set keeps its own gradient (Horovod's
    _allreduce_cond); the v1 optimizer exposes the wrapped one as _optimizer."""

    @staticmethod
    def on_rank(hvd, tf):
        only0 = hvd.add_process_set(hvd.ProcessSet([0]))
        fake = hvd.ProcessSet([0])
        fake.process_set_id = 10  # what Horovod's test does to get an unknown id
        x = tf.constant(float(hvd.rank() + 1))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x * x
        (grad,) = hvd.DistributedGradientTape(tape, process_set=only0).gradient(y, [x])
        inner = tf.compat.v1.train.GradientDescentOptimizer(1.0)
        opt = hvd.DistributedOptimizer(inner, process_set=only0)
        out = {
            "unknown": err(lambda: hvd.allreduce(tf.ones(2), process_set=fake)),
            "grad": float(grad),
            "inner": opt._optimizer is inner,
        }
        hvd.remove_process_set(only0)
        return out

    def test_values(self, job):
        for r, got in enumerate(by_rank(job, TestProcessSetsInTensorFlow)):
            assert "ValueError" in got["unknown"][1] and "process set 10" in got["unknown"][2]
            assert got["grad"] == 2.0 * (r + 1) and got["inner"]


def test_util_executing_eagerly():
    from hvdlite.tensorflow.util import _executing_eagerly

    assert _executing_eagerly() is True
    assert tf.function(lambda: tf.constant(_executing_eagerly()))().numpy() == False  # noqa: E712


def test_every_name_is_covered_or_listed():
    missing = [n for n in HOROVOD_TF_NAMES if n not in COVERED and n not in NOT_YET_HERE]
    assert not missing, "horovod.tensorflow names neither covered nor listed: %s" % missing
    both = sorted(set(COVERED) & set(NOT_YET_HERE))
    assert not both, "covered now, delete from NOT_YET_HERE: %s" % both
    stale = sorted(set(NOT_YET_HERE) - set(HOROVOD_TF_NAMES))
    assert not stale, "NOT_YET_HERE lists names Horovod lacks: %s" % stale


def _keras_names_job():
    import tensorflow as tf
    from tensorflow import keras

    import hvdlite.tensorflow.keras as hvd

    hvd.init()
    r = hvd.rank()
    shared = tf.Variable([0.0])
    local = keras.layers.Dense(1, use_bias=False)
    local.build((None, 1))
    local.kernel.assign([[0.0]])
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[local])
    opt.apply_gradients([(tf.constant([float(r)]), shared), (tf.ones([1, 1]) * (r + 1), local.kernel)])
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1), keras.layers.Dense(1)])
    for v in model.variables:
        v.assign(tf.ones_like(v) * r)
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[model.layers[1].kernel])
    callback.set_model(model)
    callback.on_train_begin()
    out = {
        "shared": shared.numpy().tolist(),
        "local": local.kernel.numpy().tolist(),
        "broadcast": [v.numpy().ravel().tolist() for v in model.variables],
    }
    hvd.shutdown()
    return out


def test_keras_partial_optimizer_and_callback_local_variables(keras_env):
    """hvdlite.tensorflow.keras.PartialDistributedOptimizer: local_layers' gradients stay
    local (divided by size, scale_local_gradients); BroadcastGlobalVariablesCallback leaves
    local_variables alone."""
    from parity_tf import TF_ENV

    for r, got in enumerate(
        run_pooled(_keras_names_job, 2, timeout=240, env=TF_ENV, spawn_env=dict(TF_SPAWN_ENV, **keras_env))
    ):
        assert got["shared"] == [-0.5]  # -(0 + 1) / 2
        assert got["local"] == [[-(r + 1) / 2.0]]
        kernel0, bias0, kernel1, bias1 = got["broadcast"]
        assert kernel0 == [0.0] and bias0 == [0.0] and bias1 == [0.0]
        assert kernel1 == [float(r)]
