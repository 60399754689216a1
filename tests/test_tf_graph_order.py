"""TensorFlow collectives do not depend on the order in which the executor runs them (issue 9).

A graph with more independent collectives than TensorFlow's inter-op threads, built and
fetched in a different order on each rank: if a waiting collective held an executor thread,
each rank's only thread would wait in a different collective and the job would hang (with
hvdlite's deadlock detector: fail). With the HvdliteAwait kernel (hvdlite/tensorflow/
await_op.cc) no executor thread waits, so every collective completes with the right value.
Covered: a tf.compat.v1 graph in a Session, a tf.function, and eager mode.
"""

import pytest
from helpers import TF_SPAWN_ENV, run_pooled

# The jobs run in the session's pooled TensorFlow ranks, started with one inter-op thread (the
# point of these tests: TensorFlow reads the count once, when its runtime starts).
TF_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "HVDLITE_STALL_CHECK_TIME_SECONDS": "600",
    "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "600",
}
COUNT = 8  # independent collectives per graph; the executors get 1 inter-op thread


def _expected(i):
    return [float(2 * i + 1)] * 3  # rank 0 gives i, rank 1 gives i + 1


def _order(rank):
    """The order in which this rank builds (and fetches) the collectives."""
    return list(range(COUNT)) if rank == 0 else list(reversed(range(COUNT)))


def _v1_graph():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow import await_op

    hvd.init()
    r = hvd.rank()
    reason = await_op.unavailable_reason()
    graph = tf.Graph()
    with graph.as_default():
        outs = {}
        for i in _order(r):
            x = tf.fill([3], tf.constant(float(i + r)))
            outs[i] = hvd.allreduce(x, op=hvd.Sum, name="v1.%d" % i)
        gathered = hvd.allgather(tf.fill([r + 1, 2], float(r)), name="v1.gather")
        op_types = {op.type for op in graph.get_operations()}
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        fetch_order = _order(r)
        values = sess.run([outs[i] for i in fetch_order] + [gathered])
        second = sess.run([outs[i] for i in reversed(fetch_order)])  # the graph runs again
    hvd.shutdown()
    by_index = {i: v.tolist() for i, v in zip(fetch_order, values[:-1])}
    again = {i: v.tolist() for i, v in zip(reversed(fetch_order), second)}
    return reason, "HvdliteAwait" in op_types, by_index, again, values[-1].tolist()


def _skip_without_kernel(results):
    reason = results[0][0]
    if reason:
        pytest.skip("the HvdliteAwait kernel is unavailable, graph collectives block: " + reason)


def test_v1_graph_with_more_collectives_than_executor_threads():
    results = run_pooled(_v1_graph, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180)
    _skip_without_kernel(results)
    for _, uses_await, by_index, again, gathered in results:
        assert uses_await
        assert by_index == again == {i: _expected(i) for i in range(COUNT)}
        assert gathered == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def _tf_function():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow import await_op

    hvd.init()
    r = hvd.rank()

    @tf.function
    def step(base):
        outs = {}
        for i in _order(r):  # program order differs between the ranks
            outs[i] = hvd.allreduce(tf.fill([3], base + float(i + r)), op=hvd.Sum, name="fn.%d" % i)
        return [outs[i] for i in range(COUNT)]

    first = [t.numpy().tolist() for t in step(tf.constant(0.0))]
    second = [t.numpy().tolist() for t in step(tf.constant(1.0))]
    hvd.shutdown()
    return await_op.unavailable_reason(), first, second


def test_tf_function_whose_ranks_order_collectives_differently():
    results = run_pooled(_tf_function, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180)
    _skip_without_kernel(results)
    for _, first, second in results:
        assert first == [_expected(i) for i in range(COUNT)]
        assert second == [[v + 2.0 for v in _expected(i)] for i in range(COUNT)]


def _eager():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    singles = [hvd.allreduce(tf.fill([3], float(i + r)), op=hvd.Sum, name="e.%d" % i) for i in range(COUNT)]
    grouped = hvd.grouped_allreduce([tf.fill([3], float(i + r)) for i in range(COUNT)], op=hvd.Sum, name="eg")
    hvd.shutdown()
    return [t.numpy().tolist() for t in singles], [t.numpy().tolist() for t in grouped]


def test_eager_collectives_complete():
    for singles, grouped in run_pooled(_eager, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180):
        assert singles == grouped == [_expected(i) for i in range(COUNT)]


def test_graph_errors_still_raise():
    """A mismatch inside a graph raises from Session.run on every rank (the result op
    raises the error the await kernel let through)."""
    results = run_pooled(_graph_mismatch, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180)
    _skip_without_kernel(results)
    for _, message in results:
        assert "v1.bad" in message and "hape" in message, message


def _graph_mismatch():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow import await_op

    hvd.init()
    r = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        out = hvd.allreduce(tf.zeros([r + 1]), name="v1.bad")
    message = ""
    with tf.compat.v1.Session(graph=graph) as sess:
        try:
            sess.run(out)
        except Exception as e:
            message = str(e)
    hvd.shutdown()
    return await_op.unavailable_reason(), message
