"""Syncing optimizer state changes nothing (issue 42, item 4): hvd.broadcast_optimizer_state and
the elastic TorchState's sync() leave parameters and optimizer arithmetic exactly as a freshly
built optimizer would. Horovod (horovod#2805) first steps an optimizer without state on zero
gradients, which with AdamW applies weight decay and moves Adam's step count."""

import pytest
import torch
from helpers import run_pooled, run_ranks

OPTIMIZERS = {
    "SGD": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "Adam": (torch.optim.Adam, {"lr": 0.01}),
    "AdamW": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _batch(step, rank=0):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)


def _train_step(model, opt, step, rank=0):
    x, y = _batch(step, rank)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _state_equal(a, b):
    """Two optimizer state dicts hold the same keys and bitwise equal values."""
    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    for pid, state in a["state"].items():
        if state.keys() != b["state"][pid].keys():
            return False
        for key, value in state.items():
            other = b["state"][pid][key]
            same = torch.equal(value, other) if torch.is_tensor(value) else value == other
            if not same:
                return False
    return True


def _one_process(name, pre_steps):
    """On one process: (the broadcast changed neither parameters nor state, training after it
    equals training without it, bitwise)."""
    import copy

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    cls, kwargs = OPTIMIZERS[name]
    runs = []
    for broadcast in (False, True):
        model = _mlp()
        opt = cls(model.parameters(), **kwargs)
        for step in range(pre_steps):
            _train_step(model, opt, step)
        unchanged = True
        if broadcast:
            before = copy.deepcopy((model.state_dict(), opt.state_dict()))
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            params_same = all(torch.equal(before[0][k], v) for k, v in model.state_dict().items())
            unchanged = params_same and _state_equal(before[1], opt.state_dict())
        for step in range(pre_steps, pre_steps + 5):
            _train_step(model, opt, step)
        runs.append((unchanged, [p.detach().clone() for p in model.parameters()], opt.state_dict()))
    hvd.shutdown()
    (_, plain, plain_state), (unchanged, synced, synced_state) = runs
    same_training = all(torch.equal(a, b) for a, b in zip(plain, synced))
    return unchanged, same_training, _state_equal(plain_state, synced_state)


@pytest.mark.parametrize("pre_steps", [0, 2])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_broadcast_optimizer_state_on_one_process_changes_nothing(name, pre_steps):
    unchanged, same_training, same_state = run_pooled(_one_process, 1, args=(name, pre_steps))[0]
    assert unchanged, "the broadcast changed the parameters or the optimizer state"
    assert same_training and same_state, "training after the broadcast differs from training without it"


STEPS = 30


def _elastic_and_plain():
    """2 ranks, AdamW with weight decay under DistributedOptimizer: STEPS steps plainly, then
    the same STEPS under hvd.elastic.run with a TorchState committed every step (no failure).
    Also: a rank with state syncs from a root without state and ends with none."""
    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    results = []
    for elastic in (False, True):
        model = _mlp()
        opt = hvd.DistributedOptimizer(
            torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1),
            named_parameters=model.named_parameters(),
        )
        if not elastic:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            for step in range(STEPS):
                _train_step(model, opt, step, hvd.rank())
        else:
            state = hvd.elastic.TorchState(model, opt, step=0)

            @hvd.elastic.run
            def train(state):
                while state.step < STEPS:
                    _train_step(state.model, state.optimizer, state.step, hvd.rank())
                    state.step += 1
                    state.commit()

            train(state)
        steps = sorted(int(s["step"]) for s in opt.state.values())
        results.append(([p.detach().clone() for p in model.parameters()], steps))
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if hvd.rank() == 1:
        _train_step(model, opt, 0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    hvd.shutdown()
    (plain, plain_steps), (elastic, elastic_steps) = results
    return (
        [p.tolist() for p in plain],
        [p.tolist() for p in elastic],
        plain_steps,
        elastic_steps,
        len(opt.state),
    )


def test_elastic_run_without_failure_equals_plain_training():
    results = run_ranks(_elastic_and_plain, 2, timeout=120)
    for plain, elastic, plain_steps, elastic_steps, left in results:
        assert elastic == plain  # bitwise: the sync at the start of run() changed nothing
        assert plain_steps == elastic_steps == [STEPS] * 4
        assert left == 0  # the root had no state: every rank ends with none, as freshly built
    assert results[0][0] == results[1][0]


def _keras_sync(name):
    """On one process: 5 Keras steps after TensorFlowKerasState.sync() (which builds the
    optimizer's slots as zeros and broadcasts every variable) equal 5 steps without it."""
    import numpy as np
    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow.elastic import TensorFlowKerasState

    hvd.init()
    make = {
        "SGD": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
        "Adam": lambda: tf.keras.optimizers.Adam(0.01),
        "AdamW": lambda: tf.keras.optimizers.AdamW(0.01, weight_decay=0.1),
    }[name]
    runs = []
    for sync in (False, True):
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential(
            [tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(2)]
        )
        opt = make()
        if sync:
            TensorFlowKerasState(model, opt, step=0).sync()
        rng = np.random.default_rng(0)
        for _ in range(5):
            x, y = rng.standard_normal((16, 4), "float32"), rng.standard_normal((16, 2), "float32")
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        runs.append(([v.numpy() for v in model.variables], int(opt.iterations.numpy())))
    hvd.shutdown()
    (plain, plain_its), (synced, synced_its) = runs
    return all(np.array_equal(a, b) for a, b in zip(plain, synced)), plain_its, synced_its


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_keras_state_sync_changes_nothing(name, keras_env):
    pytest.importorskip("tensorflow")
    same, plain_its, synced_its = run_pooled(_keras_sync, 1, args=(name,), env=keras_env, timeout=180)[0]
    assert same and plain_its == synced_its == 5
