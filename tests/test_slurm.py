"""Slurm for real: slurmctld and one slurmd per simulated host (tests/simslurm.py), `srun -N2 -n4`
of a script with nothing launcher-specific, and the sbatch example running the digits demo.
Skipped with the reason where Slurm or simulated hosts cannot run here."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_launchers_run import SCRIPT, check_job, clean_env, results

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from simhosts import SimCluster, SimHostsUnavailable
    from simslurm import SimSlurm, SlurmUnavailable

    work = tmp_path_factory.mktemp("slurm")
    os.makedirs(work / "hosts")
    cluster = SimCluster(work / "hosts", 2)
    try:
        cluster.start()
    except SimHostsUnavailable as e:
        pytest.skip("simulated hosts unavailable: %s" % e)
    try:
        with SimSlurm(cluster, work / "slurm") as sim:
            yield sim
    except SlurmUnavailable as e:
        pytest.skip("Slurm unavailable: %s" % e)
    finally:
        cluster.close()


def _srun_four_tasks(env):
    """`srun -N2 -n4` of the launched-allreduce script; the finished process (bounded)."""
    return subprocess.run(
        ["srun", "-N2", "-n4", sys.executable, SCRIPT],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_srun_two_nodes_four_tasks_allreduce(slurm):
    env = slurm.env(clean_env(HVDLITE_SECRET="cd" * 32, HVDLITE_LOG_LEVEL="debug"))
    t0 = time.monotonic()
    proc = _srun_four_tasks(env)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = results(proc.stdout)
    check_job(found, 4, 2)
    assert len({r["host"] for r in found.values()}) == 2  # two slurmd hosts, two tasks on each
    assert "launcher: srun: rank 3 of 4, local 1 of 2, cross 1 of 2" in proc.stderr
    assert "secret: HVDLITE_SECRET" in proc.stderr and "admits any process" not in proc.stderr
    print(
        "srun -N2 -n4: %.2f s wall, init %.2f s (slowest rank)"
        % (wall, max(r["init_s"] for r in found.values()))
    )


def test_sbatch_example_trains_the_digits_demo(slurm, tmp_path):
    out = tmp_path / "digits.out"
    env = slurm.env(clean_env(PYTHON=sys.executable, EPOCHS=1))
    proc = subprocess.run(
        ["sbatch", "--wait", "--output", str(out), "examples/slurm/pytorch_digits.sbatch"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    text = out.read_text() if out.exists() else "(no output file)"
    assert proc.returncode == 0, proc.stdout + proc.stderr + text
    assert "test accuracy" in text and "on 4 ranks" in text, text


def test_a_killed_task_fails_the_others_naming_it(slurm):
    """Under srun as on any host: a task SIGKILLed mid-job makes the others' next collective fail
    with an error that names the dead rank, and srun exits non-zero."""
    env = slurm.env(clean_env(HVDLITE_SECRET="cd" * 32, KILL_RANK=3, LOOP_STEPS=100, LOOP_SLEEP=0.05))
    t0 = time.monotonic()
    proc = _srun_four_tasks(env)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "HvdliteInternalError" in proc.stderr and "rank 3 (host " in proc.stderr, proc.stderr[-4000:]
    assert "closed its connection" in proc.stderr, proc.stderr[-4000:]
    # Promptly means at the next collective, not after a timeout: the error is the dead peer's
    # closed connection (above), and no survivor got through its loop to write its record. The
    # time is reported, not asserted (speed belongs in benchmarks/).
    assert results(proc.stdout) == {}, proc.stdout
    print("killed task reported to srun's other tasks: %.2f s wall" % elapsed)


def test_elastic_under_slurm_a_killed_task_leaves_survivors_that_go_on(slurm):
    """`hvdliterun --srun -np 4 --min-np 2`: each worker a one-task srun step on its Slurm node.
    A worker SIGKILLs itself at step 8: its srun step ends, the driver blacklists its node (its
    other worker leaves, as on any host), and the other node's two workers re-form and finish;
    every committed step exactly once (tests/test_elastic.py's check)."""
    from test_elastic import SCRIPT as ELASTIC_SCRIPT
    from test_elastic import check_exactly_once, worker_lines

    a, b = (h.name for h in slurm.cluster.hosts)
    victim = "%s[1]" % b
    env = slurm.env(
        clean_env(ELASTIC_STEPS="30", ELASTIC_SLEEP="0.05", ELASTIC_KILL=victim + ":8", PYTHONUNBUFFERED="1")
    )
    argv = [sys.executable, "-m", "hvdlite.runner.launch", "--srun", "-np", "4", "--min-np", "2"]
    argv += ["-H", "%s:2,%s:2" % (a, b), sys.executable, ELASTIC_SCRIPT]
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    log = check_exactly_once(proc, 30)
    assert [size for _, size in log] in ([4] * 8 + [2] * 22, [4] * 9 + [2] * 21), log
    assert "%s (its srun step) was killed by signal 9" % victim in proc.stderr, proc.stderr[-4000:]
    assert "generation 2: 2 worker(s): %s[0], %s[1]" % (a, a) in proc.stderr, proc.stderr[-4000:]
    out = worker_lines(proc.stdout)
    kill = next(float(line.split()[1]) for line in out[victim] if line.startswith("KILL"))
    after = [
        float(line.split()[4])
        for line in out["%s[0]" % a]
        if line.startswith("STEP") and line.split()[2] == "2"
    ]
    print("killed task to the survivors' next committed step: %.2f s" % (after[0] - kill))
    # Every worker's srun step ended with the job (the leaver's included): no Slurm job is left.
    deadline = time.monotonic() + 30
    while (
        left := subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip()
    ) and (time.monotonic() < deadline):
        time.sleep(0.5)
    assert left == "", left


def test_elastic_sbatch_example_inside_an_allocation(slurm, tmp_path):
    """examples/slurm/elastic.sbatch: the workers are steps of the allocation (--exact), hosts and
    slots come from it; one task killed, the other node's workers finish the training."""
    from test_elastic import SCRIPT as ELASTIC_SCRIPT
    from test_elastic import check_exactly_once

    out = tmp_path / "elastic.out"
    b = slurm.cluster.hosts[1].name
    env = slurm.env(
        clean_env(
            PYTHON=sys.executable,
            SCRIPT=ELASTIC_SCRIPT,
            ELASTIC_STEPS="30",
            ELASTIC_SLEEP="0.05",
            ELASTIC_KILL="%s[1]:8" % b,
        )
    )
    proc = subprocess.run(
        ["sbatch", "--wait", "--output", str(out), "examples/slurm/elastic.sbatch"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.read_text() if out.exists() else "(no output file)"
    assert proc.returncode == 0, proc.stdout + proc.stderr + text[-4000:]
    log = check_exactly_once(subprocess.CompletedProcess([], 0, text, text), 30)
    assert log[0][1] == 4 and log[-1][1] == 2, log
