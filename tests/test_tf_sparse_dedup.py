"""TensorFlow IndexedSlices reductions (sparse_as_dense=False) sum each rank's repeated indices
before the allgather: on 2 real ranks an embedding gradient with repeated ids reduces to the
same dense value as sparse_as_dense=True and as a NumPy reference, eagerly and in a
tf.function, while the gathered slices hold each rank's unique ids once."""

import numpy as np
from helpers import TF_SPAWN_ENV, run_pooled

V, D = 20, 3


def _ids(rank):
    return [1, 1, 5, rank + 7, 5, 5]


def _job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    table = tf.Variable(tf.reshape(tf.range(V * D, dtype=tf.float32), (V, D)) / 10.0)
    ids = tf.constant(_ids(r))
    weights = tf.constant(np.arange(len(_ids(r)) * D, dtype=np.float32).reshape(-1, D) + r)

    def gradient(sparse_as_dense):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids) * weights)
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        return tape.gradient(loss, [table])[0]

    sparse, dense = gradient(False), gradient(True)
    graph = tf.function(
        lambda: hvd.allreduce(
            tf.IndexedSlices(weights, ids, dense_shape=tf.constant([V, D])), op=hvd.Sum, name="g"
        )
    )()
    out = {
        "is_slices": isinstance(sparse, tf.IndexedSlices),
        "sparse": tf.convert_to_tensor(sparse).numpy(),
        "dense": tf.convert_to_tensor(dense).numpy(),
        "gathered_rows": int(sparse.indices.shape[0]),
        "graph": tf.convert_to_tensor(graph).numpy(),
        "graph_rows": int(graph.indices.shape[0]),
    }
    hvd.shutdown()
    return out


def _reference(size, average):
    total = np.zeros((V, D), dtype=np.float64)
    for r in range(size):
        w = np.arange(len(_ids(r)) * D, dtype=np.float64).reshape(-1, D) + r
        np.add.at(total, _ids(r), w)
    return total / (size if average else 1)


def test_indexed_slices_sum_repeats_before_the_allgather():
    results = run_pooled(_job, 2, timeout=240, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, spawn_env=TF_SPAWN_ENV)
    unique_rows = sum(len(set(_ids(r))) for r in range(2))
    for rank, got in enumerate(results):
        assert got["is_slices"], rank
        np.testing.assert_allclose(got["sparse"], _reference(2, True), rtol=1e-6)
        np.testing.assert_allclose(got["sparse"], got["dense"], rtol=1e-6)
        np.testing.assert_allclose(got["graph"], _reference(2, False), rtol=1e-6)
        assert got["gathered_rows"] == unique_rows == got["graph_rows"], (rank, got)
