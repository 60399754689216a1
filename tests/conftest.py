"""Shared fixtures. Multi-rank tests use tests/helpers.py (run_ranks / spawn_ranks)."""

import os
import socket

import pytest

# One compute thread per rank and per test process: the machines have 2 cores.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


@pytest.fixture
def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to it soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def simhosts(tmp_path):
    """Factory: simhosts(n) builds n simulated hosts (tests/simhosts.py) torn down after the test;
    skips with the reason where this machine cannot build them."""
    from simhosts import SimCluster, SimHostsUnavailable

    clusters = []

    def make(num_hosts):
        cluster = SimCluster(tmp_path / ("sim%d" % len(clusters)), num_hosts)
        os.makedirs(cluster.workdir)
        try:
            cluster.start()
        except SimHostsUnavailable as e:
            pytest.skip("simulated hosts unavailable: %s" % e)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()


# The two Keras that tf.keras can be on TensorFlow 2.16+ (hvdlite/tensorflow/_keras.py): the
# environment that selects each. TensorFlow reads the variable when it is imported, so it goes
# into the environment of the processes a test starts (run_ranks(env=...), subprocess env).
KERAS_ENVS = {"keras3": {"TF_USE_LEGACY_KERAS": "0"}, "keras2": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.fixture(scope="module", params=["keras3", pytest.param("keras2", marks=pytest.mark.slow)])
def keras_env(request):
    """A test (or module-scoped fixture) taking this runs once per Keras: the value is the
    environment its ranks / subprocesses need. Keras 2 skips where tf_keras is not installed.
    The Keras 2 runs are slow-marked (CI runs them); the default suite covers Keras 2 through
    the `keras2_env` fixture's tests."""
    import importlib.util

    if request.param == "keras2" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras (Keras 2) is not installed; `make install` installs it")
    return dict(KERAS_ENVS[request.param])


@pytest.fixture(scope="module")
def keras2_env():
    """The environment of a test that is about Keras 2 alone (it runs in the default suite);
    skips where tf_keras is not installed."""
    import importlib.util

    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras (Keras 2) is not installed; `make install` installs it")
    return dict(KERAS_ENVS["keras2"])


@pytest.fixture(scope="session", autouse=True)
def _close_rank_pools():
    """The rank processes of helpers.run_pooled live for the session; stopped at its end."""
    yield
    import helpers

    helpers.close_pools()
