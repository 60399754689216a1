"""Horovod 0.28.1's elastic integration scenarios through the `horovodrun` command line, with
Horovod's own training scripts unchanged (tests/horovod_elastic.py). Slow (each run is a whole
elastic job, 5-60 s); they need Horovod's sources (HOROVOD_SRC or the local mirror) and skip
with the reason without them. The TensorFlow 2 script's reset callback assigns optimizer.lr,
which only Keras 2 optimizers have, so it runs under TF_USE_LEGACY_KERAS=1 (tf_keras)."""

import importlib.util
import subprocess

import horovod_elastic
import horovod_suite
import pytest
from concurrent_cases import ConcurrentCases

HAVE = {
    name: importlib.util.find_spec(name) is not None for name in ("torch", "tensorflow", "tf_keras", "psutil")
}


# A scenario is whole elastic jobs that mostly wait (discovery intervals, the scripts' sleeps,
# elastic timeouts): the selected ones run CONCURRENT at a time (tests/concurrent_cases.py), each
# judged by its own test.
CONCURRENT = 3


def _run_scenario(scenario, framework):
    """The runs of one scenario (horovod_elastic.run_scenario); skips where it cannot run."""
    reason = horovod_suite.available()
    if reason:
        pytest.skip(reason)
    needs = ["psutil", "torch"] if framework == "torch" else ["psutil", "tensorflow", "tf_keras"]
    missing = [n for n in needs if not HAVE[n]]
    if missing:
        pytest.skip("Horovod's elastic_%s_main.py needs %s" % (framework, ", ".join(missing)))
    env = {"TF_USE_LEGACY_KERAS": "1"} if framework == "tensorflow2" else {}
    return horovod_elastic.run_scenario(scenario, framework, env)


@pytest.fixture(scope="module")
def scenario_runs(request):
    with ConcurrentCases(request, "test_horovod_elastic_scenario", _run_scenario, CONCURRENT) as cases:
        yield cases


# Scenarios that end the job (the driver's reset limit, blacklisting, minimum-hosts timeout,
# every rank failing) test the elastic driver, whatever framework its workers run: they run with
# torch only. The scenarios whose workers recover and go on (their state restored and synced
# after a reset) run with both frameworks. The TensorFlow runs of the others took 29-100 s each
# (TensorFlow starts in every elastic generation), a fifth of the whole CI run's time.
JOB_ENDING = {
    "test_reset_limit",
    "test_all_ranks_failure",
    "test_min_hosts_timeout",
    "test_all_hosts_blacklisted",
}

# The cases start in this order, longest first, so the last to finish is not a long one started
# late: each case's own run time in seconds, measured alone (tests/concurrent_cases.py prints it).
RUN_SECONDS = {
    ("test_hosts_added_and_removed", "tensorflow2"): 110,
    ("test_fault_tolerance_without_scaling", "tensorflow2"): 69,
    ("test_single_rank_failure", "tensorflow2"): 66,
    ("test_reset_limit", "torch"): 57,
    ("test_hosts_added_and_removed", "torch"): 50,
    ("test_resurrecting_blacklisted_hosts_exponential_backoff", "tensorflow2"): 37,
    ("test_fault_tolerance_without_scaling", "torch"): 36,
}

CASES = sorted(
    (
        (s, f)
        for s in horovod_elastic.SCENARIOS
        for f in (("torch",) if s in JOB_ENDING else ("torch", "tensorflow2"))
    ),
    key=lambda case: (-RUN_SECONDS.get(case, 0), case),
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "framework"), [pytest.param(s, f, id="%s-%s" % (s, f)) for s, f in CASES]
)
def test_horovod_elastic_scenario(scenario, framework, scenario_runs):
    runs = scenario_runs.result(scenario=scenario, framework=framework)
    problems = ["%s\n  %s\n%s" % (cmd, "\n  ".join(p), out[-3000:]) for cmd, p, out in runs if p]
    assert not problems, "\n\n".join(problems)


def test_discovery_script_follows_the_schedule(tmp_path):
    """The generated discovery script prints each epoch's hosts (epoch: lines in the log file)."""
    log = tmp_path / "log.txt"
    script = tmp_path / "discover.sh"
    script.write_text(horovod_elastic.discovery_script(str(log), horovod_elastic.ADD_REMOVE))
    script.chmod(0o755)
    seen = []
    for lines in range(3):
        log.write_text("{}\n" * lines)
        seen.append(subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout.split())
    assert seen == [["localhost:2"], ["localhost:2", "127.0.0.1:2"], ["127.0.0.1:2"]]
