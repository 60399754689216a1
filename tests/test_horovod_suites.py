"""Horovod 0.28.1's own test files, unchanged, against hvdlite (tests/horovod_suite.py), and the
runner itself on a small stand-in test file.

The Horovod suites need Horovod's sources (HOROVOD_SRC, or the local mirror) and skip with the
reason without them; they are slow (minutes) and run where CI is set. A test listed in
EXPECTED_FAILURES is written against an API the active Keras no longer has; any other failure,
and any hang, fails here. The lists only shrink: a listed test that passes is reported too."""

import importlib.util
import shutil
import textwrap

import horovod_suite
import pytest
from concurrent_cases import ConcurrentCases

HAVE_TF_KERAS = importlib.util.find_spec("tf_keras") is not None  # no import: collection stays fast

# (Horovod test file, Keras setting) -> {test name: why it cannot pass under that Keras}
EXPECTED_FAILURES = {
    ("test_tensorflow.py", "keras3"): {
        "test_horovod_syncbn_cpu": "builds tf.keras.layers.BatchNormalization(fused=False): Keras 2 only",
        "test_partial_distributed_gradient_tape": "calls .ref() on Keras variables: Keras 2 only",
    },
    ("test_tensorflow.py", "legacy"): {},
    ("test_tensorflow2_keras.py", "legacy"): {},
    ("test_tensorflow2_keras.py", "keras3"): {
        "test_broadcast_global_variables_callback_with_local_vars": "calls .ref() on Keras variables: Keras 2 only",
        "test_partial_distributed_optimizer": "calls .ref() on Keras variables: Keras 2 only",
        "test_gradient_aggregation_0": "builds an optimizer without learning_rate: Keras 2 only",
        "test_gradient_aggregation_1": "builds an optimizer without learning_rate: Keras 2 only",
        "test_gradient_aggregation_with_local_vars_0": "builds an optimizer without learning_rate: Keras 2 only",
        "test_gradient_aggregation_with_local_vars_1": "builds an optimizer without learning_rate: Keras 2 only",
        "test_legacy_optimizer": "uses keras.optimizers.legacy: Keras 2 only",
        "test_sparse_as_dense": "passes lr= to the optimizer: Keras 2 only",
        "test_sparse_as_dense_with_grad_aggregation": "passes lr= to the optimizer: Keras 2 only",
        "test_train_model_lr_schedule": "uses keras.losses.mean_squared_error: Keras 2 only",
    },
}
# Written for NumPy 1: it compares a float16 error with 1e-08, which NumPy 2 rounds to float16 0.
_NUMPY1 = {
    "test_horovod_reducescatter_grad_cpu_process_sets": "float16 error < 1e-08 is never true in NumPy 2"
}
EXPECTED_FAILURES["test_tensorflow_process_sets.py", "keras3"] = _NUMPY1
EXPECTED_FAILURES["test_tensorflow_process_sets.py", "legacy"] = _NUMPY1


# Horovod's other test/parallel files, unchanged, under the launchers Horovod's CI uses:
# horovodrun (its Gloo jobs: horovodrun -np 2 -H localhost:2) and mpirun (its MPI jobs).
_MUON = "Horovod's own test lists torch.optim.Muon, which takes 2-D parameters only: fails in Horovod too"
_LEGACY = {"TF_USE_LEGACY_KERAS": "1"}
# file -> (framework it imports, rank environment, {test: why it cannot pass}); FAST ones also
# run without CI.
LAUNCHER_SUITES = {
    "test_common.py": (None, {}, {}),
    "test_timeline.py": ("torch", {}, {}),
    "test_process_sets_static.py": ("tensorflow", {}, {}),
    "test_process_sets_multi_comm.py": ("tensorflow", {}, {}),  # MPI only: skips itself under horovodrun
    "test_tensorflow_process_sets_dynamic.py": ("tensorflow", {}, {}),
    "test_tensorflow2_keras_process_sets.py": ("tensorflow", _LEGACY, {}),
    "test_adasum_pytorch.py": ("torch", {}, {}),  # its CPU cases need MPI: skipped under horovodrun
    "test_adasum_tensorflow.py": ("tensorflow", {}, {}),
    "test_xla.py": ("tensorflow", {}, {}),  # CPU cases only; the GPU ones skip
    "test_xla_process_sets.py": ("tensorflow", {}, {}),
    "test_torch.py": (
        "torch",
        {},
        dict.fromkeys(
            ["test_broadcast_state", "test_broadcast_state_options", "test_force_allreduce"], _MUON
        ),
    ),
    "test_tensorflow_process_sets.py": ("tensorflow", {}, _NUMPY1),
    "test_tensorflow.py": ("tensorflow", {}, EXPECTED_FAILURES["test_tensorflow.py", "keras3"]),
    "test_tensorflow2_keras.py": ("tensorflow", _LEGACY, {}),
    # tf.data service servers in threads of each rank (hvdlite.tensorflow.data); one case skips itself
    "test_compute_worker.py": ("tensorflow", {}, {}),
}
FAST = {"test_common.py"}  # seconds; the others take tens of seconds each (slow)
# Run under horovodrun only: the three large TensorFlow files take one to two minutes a run
# each, and under mpirun they would repeat the horovodrun run (same ops, same backend: the
# launcher only starts the ranks) while every other file here covers the mpirun launch path
# (test_torch.py, the TensorFlow process-set files, and the MPI-only ones,
# test_process_sets_multi_comm.py and the Adasum files, included).
HOROVODRUN_ONLY = {"test_tensorflow.py", "test_tensorflow_process_sets.py", "test_tensorflow2_keras.py"}
# Files of test/parallel that cannot pass on this platform, and why.
NOT_RUNNABLE = {
    "test_keras.py": "TensorFlow 1 only: builds tf.ConfigProto at import, which TensorFlow 2 lacks",
    "test_tensorflow_keras.py": "TensorFlow 1 only: every test skips itself on TensorFlow 2",
    "test_mxnet1.py": "MXNet: hvdlite has no MXNet adapter",
    "test_mxnet2.py": "MXNet: hvdlite has no MXNet adapter",
}


# A launch leaves a 2-core machine more than half idle (its ranks wait on each other between
# collectives; the launcher starts and joins them): six mpirun launches one at a time used 39% of
# the CPU time of their 105 s, two at a time took 72 s. So CONCURRENT of the selected launches
# run at a time (tests/concurrent_cases.py), each judged by its own test.
CONCURRENT = 2
# The launch that takes longest (about 2 minutes, the others under 30 s) is submitted first, so
# that the others share the time it takes instead of following it.
LONGEST = "test_tensorflow.py"


def _run_under_launcher(test_file, launcher):
    """The SuiteResult of test_file on 2 ranks started by launcher; skips where it cannot run."""
    reason = horovod_suite.available()
    if reason:
        pytest.skip(reason)
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed")
    needs, env, _ = LAUNCHER_SUITES[test_file]
    if needs:
        pytest.importorskip(needs)
    if env.get("TF_USE_LEGACY_KERAS") and not HAVE_TF_KERAS:
        pytest.skip("TF_USE_LEGACY_KERAS=1 needs the tf_keras package")
    return horovod_suite.run_suite(test_file, np=2, env=env, timeout=300, launcher=launcher)


@pytest.fixture(scope="module")
def launcher_runs(request):
    name = "test_horovod_suite_under_horovods_launchers"
    with ConcurrentCases(request, name, _run_under_launcher, CONCURRENT) as cases:
        yield cases


@pytest.mark.parametrize(
    "test_file,launcher",
    [
        pytest.param(f, launcher, marks=() if f in FAST else pytest.mark.slow)
        for launcher in ("horovodrun", "mpirun")
        for f in sorted(LAUNCHER_SUITES, key=lambda f: (f != LONGEST, f))
        if not (launcher == "mpirun" and f in HOROVODRUN_ONLY)
    ],
)
def test_horovod_suite_under_horovods_launchers(test_file, launcher, launcher_runs):
    result = launcher_runs.result(test_file=test_file, launcher=launcher)
    # need_pass=False: e.g. test_xla_process_sets.py has GPU tests only
    _judge(result, LAUNCHER_SUITES[test_file][2], need_pass=False)


# Horovod tests that assert a race's outcome: they pass or fail with the machine's timing, in
# Horovod too. A failure of one of these is reported in the summary, not judged.
TIMING_DEPENDENT = {
    # asserts that hvd.poll() returned False at least once: an op done before the first poll fails it
    "test_horovod_reducescatter_async_fused": "hvd.poll() may find every fused op already done",
    # the same assertion for 17-element allreduces, polled right after each submission: a 2-rank
    # steady state finishes one in a few µs, inside the submitting call's Python overhead (it
    # failed under both launchers in a full CI run and passed 3 of 3 runs of its own)
    "test_horovod_allreduce_async_fused": "hvd.poll() may find every small allreduce already done",
    # asserts that every rank's barrier() took >= 5 s while rank 0 slept 5 s before it, timed from
    # each rank's own start: rank 1's time is 5 s plus the barrier's release latency (0.4-0.6 ms
    # here, measured) minus how much later than rank 0 it left the allreduce before; under load
    # that skew can pass the latency (it failed once under mpirun in a full CI run, 2026-11-27)
    "test_global_barrier_op": "a barrier released within a millisecond can measure under 5 s on the later rank",
}


def _judge(result, expected, need_pass=True):
    """need_pass=False: a file whose tests may all skip here (GPU or MPI only under horovodrun)
    must still have run and reported them."""
    failed = {n.split("::")[-1]: r for n, r in result.named("failed").items()}
    unexpected = {n: r for n, r in failed.items() if n not in expected and n not in TIMING_DEPENDENT}
    assert not unexpected and not result.named("hang"), result.summary()
    assert result.tests, result.summary() + "\n" + result.log_tail
    assert result.counts()["passed"] > 0 or not need_pass, result.summary() + "\n" + result.log_tail
    now_passing = sorted(set(expected) - set(failed) - set(TIMING_DEPENDENT))
    assert not now_passing, "these pass now, remove them from EXPECTED_FAILURES: %s" % now_passing


# The (file, Keras) pairs test_horovod_suite_under_horovods_launchers already runs under
# horovodrun (hvdliterun under Horovod's name): each runs once, there (a TensorFlow file takes
# up to 90 s).
UNDER_LAUNCHERS = {
    (f, "legacy" if env.get("TF_USE_LEGACY_KERAS") else "keras3")
    for f, (_, env, _) in LAUNCHER_SUITES.items()
}


# A file whose Keras 3 run is above runs under Keras 2 (TF_USE_LEGACY_KERAS=1) only the tests
# that can differ there: the variable changes what tf.keras is (TensorFlow resolves it to
# tf_keras) and, in hvdlite, only the modules of KERAS_MODULES; every other test runs the same
# TensorFlow and hvdlite code under both (test_tensorflow.py: 7 of its 143 tests differ).
# KERAS_MODULES: hvdlite/tensorflow file that reads the active Keras -> the name through which
# a test reaches it; test_keras_modules_are_all_named checks that no other module mentions Keras.
KERAS_MODULES = {
    "_keras.py": "keras",
    "keras/": "keras",  # hvd.keras (horovod.tensorflow.keras, horovod.keras), load_model
    "keras_optimizer.py": "DistributedOptimizer",  # and PartialDistributedOptimizer
    "optimizer.py": "DistributedOptimizer",
    "gradient_aggregation.py": "DistributedOptimizer",  # its local gradient aggregation
    "sync_batch_norm.py": "SyncBatchNormalization",
    "elastic.py": "elastic",  # TensorFlowKerasState
}
KERAS_SELECTOR = "|".join(sorted(set(KERAS_MODULES.values())))


@pytest.mark.slow
@pytest.mark.parametrize("test_file,keras", sorted(set(EXPECTED_FAILURES) - UNDER_LAUNCHERS))
def test_horovod_tensorflow_suite(test_file, keras):
    """The Keras the launcher runs above do not cover: test_tensorflow.py and
    test_tensorflow_process_sets.py under Keras 2 (their Keras-dependent tests: KERAS_SELECTOR),
    test_tensorflow2_keras.py under Keras 3 (whole)."""
    pytest.importorskip("tensorflow")
    reason = horovod_suite.available()
    if reason:
        pytest.skip(reason)
    if keras == "legacy" and not HAVE_TF_KERAS:
        pytest.skip("TF_USE_LEGACY_KERAS=1 needs the tf_keras package")
    env = {"TF_USE_LEGACY_KERAS": "1"} if keras == "legacy" else {}
    select, names = None, []
    if keras == "legacy" and (test_file, "keras3") in UNDER_LAUNCHERS:
        names = horovod_suite.test_names(test_file, KERAS_SELECTOR)
        keras2_only = {
            n for n, why in EXPECTED_FAILURES.get((test_file, "keras3"), {}).items() if "Keras 2 only" in why
        }
        assert names and keras2_only <= set(names), (KERAS_SELECTOR, names, keras2_only)
        select = ["-k", " or ".join(names)]
    result = horovod_suite.run_suite(test_file, np=2, env=env, timeout=300, select=select)
    expected = EXPECTED_FAILURES[test_file, keras]
    if names:  # the selection's own: a listed test that was not selected did not run
        expected = {n: why for n, why in expected.items() if _selected(n, names)}
    _judge(result, expected)
    ran = [n.split("::")[-1] for n in result.tests]
    not_run = [n for n in names if not any(_selected(r, [n]) for r in ran)]
    assert not not_run, "selected but not run: %s\n%s" % (not_run, result.summary())


def _selected(test, names):
    """Whether test (a name as pytest reports it: parameterized ones end in _<index>) is one of
    names."""
    return any(test == n or test.startswith(n + "_") for n in names)


def test_keras_modules_are_all_named():
    """Every file of hvdlite/tensorflow that mentions keras is in KERAS_MODULES, so the Keras 2
    runs above select every test that can reach one."""
    root = horovod_suite.REPO / "hvdlite" / "tensorflow"
    mention = set()
    for path in root.rglob("*.py"):
        if "keras" in path.read_text():
            rel = path.relative_to(root).as_posix()
            mention.add(rel.split("/")[0] + "/" if "/" in rel else rel)
    assert mention == set(KERAS_MODULES)


def test_without_sources_the_reason_names_horovod_src(tmp_path):
    reason = horovod_suite.available(str(tmp_path / "nothing"))
    assert reason and "HOROVOD_SRC" in reason


_STANDIN = '''
import os
import time
import pytest

def test_a_pass():
    assert int(os.environ["HOROVOD_SIZE"]) == 2

def test_b_fail_on_rank_1():
    assert os.environ["HOROVOD_RANK"] == "0"

def test_c_skip():
    pytest.skip("no GPU here")

def test_d_hang():
    time.sleep(600)

def test_e_after_the_hang():
    pass
'''


@pytest.fixture
def standin_tree(tmp_path):
    """A directory laid out as Horovod's test tree, holding the stand-in test file above."""
    (tmp_path / "test" / "parallel").mkdir(parents=True)
    (tmp_path / "test" / "utils").mkdir()
    (tmp_path / "test" / "conftest.py").write_text("")
    (tmp_path / "test" / "utils" / "common.py").write_text("")
    (tmp_path / "test" / "parallel" / "test_standin.py").write_text(textwrap.dedent(_STANDIN))
    return tmp_path


@pytest.mark.slow  # waits out a per-test timeout on purpose
def test_runner_joins_ranks_and_resumes_after_a_hang(standin_tree, tmp_path):
    result = horovod_suite.run_suite(
        "test_standin.py", np=2, timeout=8, src=str(standin_tree), workdir=str(tmp_path)
    )
    got = {n.split("::")[-1]: o.outcome for n, o in result.tests.items()}
    assert got == {
        "test_a_pass": "passed",
        "test_b_fail_on_rank_1": "failed",  # failed on one rank: failed
        "test_c_skip": "skipped",
        "test_d_hang": "hang",
        "test_e_after_the_hang": "passed",  # run by the second launch
    }, result.summary()
    assert result.launches == 2
    assert "no GPU here" in result.tests["test_standin.py::test_c_skip"].reason


def test_runner_each_mode_runs_tests_alone(standin_tree, tmp_path):
    ids = ["test_standin.py::test_a_pass", "test_standin.py::test_b_fail_on_rank_1"]
    result = horovod_suite.run_suite(
        "test_standin.py",
        np=2,
        timeout=15,
        mode="each",
        select=ids,
        src=str(standin_tree),
        workdir=str(tmp_path),
    )
    assert {n: o.outcome for n, o in result.tests.items()} == dict(zip(ids, ["passed", "failed"]))
    assert result.launches == 2


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_runner_starts_ranks_with_horovods_launchers(standin_tree, tmp_path, launcher):
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed")
    result = horovod_suite.run_suite(
        "test_standin.py",
        np=2,
        timeout=15,
        select=["-k", "test_c_skip or test_e_after_the_hang"],
        src=str(standin_tree),
        workdir=str(tmp_path),
        launcher=launcher,
    )
    got = {n.split("::")[-1]: o.outcome for n, o in result.tests.items()}
    assert got == {"test_c_skip": "skipped", "test_e_after_the_hang": "passed"}, (
        result.summary() + result.log_tail
    )
