"""Gradients of a DistributedGradientTape inside tf.function are allreduced as soon as each
exists (issue 15), with the values of a reduction after the whole backward pass, and the
reused aligned buffers (hvdlite.common.buffer_pool) never overwrite a result still in use.

Overlap is checked on the graph's structure, not on time: one native submission per gradient
whose only input is that gradient and which waits for no other submission (so each may run
while the backward pass goes on, whatever order the executor computes the gradients in)."""

import weakref

import numpy as np
import pytest
from helpers import TF_SPAWN_ENV, run_pooled

from hvdlite.common.buffer_pool import AlignedPool

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _deps(op):
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _tape_job():
    import keras
    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow import await_op

    hvd.init()
    r = hvd.rank()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)]
    )
    x = tf.random.stateless_normal([4, 8], seed=[r, 1])

    @tf.function
    def step():
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        local = tape.gradient(loss, model.trainable_variables)
        reduced = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        return local, reduced

    graph = step.get_concrete_function().graph
    submits = [op for op in graph.get_operations() if op.type == "HvdliteAllreduceSubmit"]
    variables = model.trainable_variables  # kernel0, bias0, kernel1, bias1
    # each submission's input: the gradient itself (the kernel forwards its buffer, see await_op.cc)
    feeds = [op.inputs[0] for op in submits]
    structure = {
        "count": len(submits),
        "arity": [len(op.inputs) for op in submits],
        "feeds": [f.op.type for f in feeds],
        "shapes": [f.shape.as_list() for f in feeds],
        "waits_for_another": [any(o in _deps(op) for o in submits) for op in submits],
    }
    first_layer_grad = feeds[-1].op
    # each await (whose output is the reduced gradient) waits for its own submission only
    awaits = [op for op in graph.get_operations() if op.type == "HvdliteAwait"]
    structure["await_inputs"] = [[t.op.type for t in op.inputs] for op in awaits]
    structure["await_waits_for"] = [len([o for o in _deps(op) if o in submits + awaits]) for op in awaits]
    structure["first_waits_for_first_layer"] = first_layer_grad in _deps(submits[0])
    local, reduced = step()
    reference = hvd.grouped_allreduce(list(local), name="reference")  # after the whole pass, eagerly
    _, again = step()  # a second step: buffers TensorFlow forwards again are written again
    hvd.shutdown()
    return {
        "reason": await_op.unavailable_reason(),
        "structure": structure,
        "var_shapes": [v.shape.as_list() for v in variables],
        "reduced": [t.numpy() for t in reduced],
        "reference": [t.numpy() for t in reference],
        "again": [t.numpy() for t in again],
        "local": [t.numpy() for t in local],
    }


def test_tape_in_tf_function_submits_each_gradient_when_it_exists():
    results = run_pooled(_tape_job, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=240)
    if results[0]["reason"]:
        pytest.skip("the HvdliteAwait kernel is unavailable: " + results[0]["reason"])
    for out in results:
        s = out["structure"]
        assert s["count"] == 4  # one submission per gradient
        assert s["arity"] == [1] * 4  # its only input: that gradient
        # created last layer first: bias1, kernel1, bias0, kernel0
        assert s["shapes"] == [out["var_shapes"][i] for i in (3, 2, 1, 0)]
        assert s["feeds"] == ["BiasAddGrad", "MatMul", "BiasAddGrad", "MatMul"]
        # none waits for another (no program-order chain): each starts when its gradient exists
        assert s["waits_for_another"] == [False] * 4
        assert not s["first_waits_for_first_layer"]
        assert s["await_inputs"] == [["HvdliteAllreduceSubmit"] * 2] * 4
        assert s["await_waits_for"] == [1] * 4
    for out in results:
        for got, ref, again in zip(out["reduced"], out["reference"], out["again"]):
            assert got.tobytes() == ref.tobytes()  # bitwise: overlapped == reduced after the pass
            assert again.tobytes() == got.tobytes()
    for a, b in zip(results[0]["reduced"], results[1]["reduced"]):
        assert a.tobytes() == b.tobytes()  # the same on every rank
    assert any(
        a.tobytes() != b.tobytes() for a, b in zip(results[0]["local"], results[1]["local"])
    )  # the ranks' own gradients differed, so the reduction did something


def _kept_results_job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    r = hvd.rank()

    @tf.function
    def step(k):
        return hvd.allreduce(tf.fill([1000], k + float(r)), op=hvd.Sum, name="kept")

    kept = [step(tf.constant(float(k))) for k in range(4)]  # each result still alive
    eager = [hvd.allreduce(tf.fill([1000], float(k + r)), op=hvd.Sum, name="kept.e") for k in range(4)]
    hvd.shutdown()
    return [t.numpy().tolist() for t in kept], [t.numpy().tolist() for t in eager]


def test_results_still_held_are_never_reused():
    for kept, eager in run_pooled(_kept_results_job, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180):
        assert kept == eager == [[2.0 * k + 1.0] * 1000 for k in range(4)]


def _dropped_result_job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    r = hvd.rank()

    @tf.function
    def step(k):
        hvd.allreduce(tf.fill([1000], k), op=hvd.Sum, name="dropped")  # result unused
        return hvd.allreduce(tf.fill([4], k + float(r)), op=hvd.Sum, name="used")

    graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    control = sorted(op.type for op in graph.control_outputs if op.type.startswith("Hvdlite"))
    outs = [step(tf.constant(float(k))).numpy().tolist() for k in range(3)]
    hvd.shutdown()
    return control, outs


def test_an_unused_result_is_still_awaited():
    """The await keeps the buffer the core writes into alive and releases the handle, so it
    must run even when nothing reads the allreduce's result (a control output of the function)."""
    for control, outs in run_pooled(_dropped_result_job, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180):
        if control:  # the native submission (absent without the kernel library)
            assert control == ["HvdliteAllreduceSubmit"] * 2 + ["HvdliteAwait"] * 2, control
        assert outs == [[2.0 * k + 1.0] * 4 for k in range(3)]


def _shared_inputs_job():
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    c = tf.constant([1.0, 2.0])
    v = tf.Variable([3.0 + r, 4.0])

    @tf.function
    def step():
        y = v * 2.0  # also returned: another reader of the allreduce's input
        summed = [hvd.allreduce(t, op=hvd.Sum, name="in.%d" % i) for i, t in enumerate([c, v, y, c])]
        return summed, y

    runs = []
    for _ in range(2):  # a constant written in place would show on the second run
        summed, y = step()
        runs.append(([t.numpy().tolist() for t in summed], y.numpy().tolist()))
    hvd.shutdown()
    return runs, c.numpy().tolist(), v.numpy().tolist()


def test_inputs_other_ops_read_are_not_written():
    """The in-place allreduce works on the input's own buffer only when nothing else holds it
    (HvdliteExclusive): a constant, a variable and a tensor the function also returns keep
    their values."""
    for rank, (runs, c, v) in enumerate(
        run_pooled(_shared_inputs_job, 2, spawn_env=TF_SPAWN_ENV, env=TF_ENV, timeout=180)
    ):
        assert c == [1.0, 2.0] and v == [3.0 + rank, 4.0]
        for summed, y in runs:
            assert summed == [[2.0, 4.0], [7.0, 8.0], [14.0, 16.0], [2.0, 4.0]]
            assert y == [2.0 * (3.0 + rank), 8.0]


def test_pool_reuses_only_unreferenced_buffers():
    pool = AlignedPool(alignment=64, capacity=1 << 20)
    a = pool.take(np.float32, (10, 3))
    assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous and a.flags.writeable
    b = pool.take(np.float32, (30,))  # same size, a still referenced: another buffer
    assert a.ctypes.data != b.ctypes.data
    address = a.ctypes.data
    view = a[1:]
    del a
    c = pool.take(np.float32, (30,))  # a's view still alive: not reused
    assert c.ctypes.data not in (address, b.ctypes.data)
    del view
    assert pool.take(np.float32, (5, 6)).ctypes.data == address
    copied = pool.copy(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert copied.dtype == np.int64 and copied.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_pool_drops_idle_buffers_beyond_its_capacity():
    pool = AlignedPool(alignment=64, capacity=1000)
    held = [pool.take(np.uint8, (400,)) for _ in range(4)]  # in use: kept whatever the capacity
    raws = [weakref.ref(h.base) for h in held]
    del held
    assert all(r() is not None for r in raws)  # idle, not yet trimmed
    fresh = pool.take(np.uint8, (100,))  # a new buffer: trims the idle ones to 1000 bytes
    assert fresh.size == 100
    assert [r() is None for r in raws] == [True, True, False, False]  # oldest dropped first
