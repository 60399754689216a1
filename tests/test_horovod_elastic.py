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


# The cases start in this order, longest first, so the last to finish is not a long one started
# late (a full CI run, 2026-11-27: TensorFlow's reset-limit case alone ran past every other one, and
# TensorFlow's scenarios, which start TensorFlow in every elastic run, take 2-10x torch's).
LONGEST_FIRST = [
    ("test_reset_limit", "tensorflow2"),
    ("test_hosts_added_and_removed", "tensorflow2"),
    ("test_fault_tolerance_without_scaling", "tensorflow2"),
    ("test_single_rank_failure", "tensorflow2"),
    ("test_all_hosts_blacklisted", "tensorflow2"),
    ("test_all_ranks_failure", "tensorflow2"),
    ("test_all_hosts_blacklisted", "torch"),
    ("test_fault_tolerance_without_scaling", "torch"),
]


def _case_order(case):
    return (LONGEST_FIRST.index(case) if case in LONGEST_FIRST else len(LONGEST_FIRST), case)


CASES = sorted(((s, f) for s in horovod_elastic.SCENARIOS for f in ("torch", "tensorflow2")), key=_case_order)


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
