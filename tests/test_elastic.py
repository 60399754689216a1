"""Elastic training end to end: `hvdliterun --min-np` over localhost "hosts" (localhost,
127.0.0.1, 127.0.0.2, ... are distinct hosts to the driver; no ssh), running
tests/elastic_train.py. Survivors keep their processes: they raise HorovodInternalError,
restore the last commit, re-form and finish with every committed step done exactly once."""

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "tests" / "elastic_train.py")
LINE = re.compile(r"^\[([^\]]+\])\]<(stdout|stderr)>:(.*)$")

pytestmark = pytest.mark.elastic


def hvdliterun(*args, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", *[str(a) for a in args]],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def worker_lines(text, stream="stdout"):
    """{worker id: [line, ...]} of the prefixed lines of `stream`."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(2) == stream:
            out.setdefault(m.group(1), []).append(m.group(3))
    return out


def reference_weights(log):
    """Replays the committed steps of tests/elastic_train.py."""
    w = np.zeros(4)
    for step, size in log:
        w = w - 0.1 * np.mean([(step + 1) * 0.01 + r for r in range(size)])
    return w


def done_of(res):
    """(log, w) from rank 0's DONE line."""
    for lines in worker_lines(res.stdout).values():
        for line in lines:
            if line.startswith("DONE "):
                log_text, _, w_text = line[5:].partition("] [")
                return [tuple(x) for x in json.loads(log_text + "]")], json.loads("[" + w_text)
    raise AssertionError("no DONE line:\n" + res.stdout[-3000:] + res.stderr[-3000:])


def check_exactly_once(res, steps):
    log, w = done_of(res)
    assert [s for s, _ in log] == list(range(steps)), log
    np.testing.assert_allclose(w, reference_weights(log), rtol=1e-12)
    return log


HOSTS3 = "localhost:1,127.0.0.1:1,127.0.0.2:1"


@pytest.mark.parametrize("how", ["ELASTIC_KILL", "ELASTIC_RAISE"])
def test_survivors_of_a_failed_worker_reform_and_lose_no_committed_step(how):
    env = {"ELASTIC_STEPS": "20", how: "127.0.0.2[0]:8"}
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, SCRIPT, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    log = check_exactly_once(res, 20)
    # step 8's allreduce was submitted before the failure: it may have completed on 3 ranks
    sizes = [size for _, size in log]
    assert sizes in ([3] * 8 + [2] * 12, [3] * 9 + [2] * 11), sizes
    err = worker_lines(res.stderr, "stderr")
    assert "generation 2: 2 worker(s): localhost[0], 127.0.0.1[0]" in res.stderr
    if how == "ELASTIC_RAISE":
        assert any("fails on purpose" in line for line in err.get("127.0.0.2[0]", [])), res.stderr
    # the survivors were never restarted: one process each (a restarted worker gets a new
    # name), from step 0 to the end (the step whose commit met the failure prints nothing)
    out = worker_lines(res.stdout)
    assert sorted(out) == ["127.0.0.1[0]", "127.0.0.2[0]", "localhost[0]"]
    for wid in ("localhost[0]", "127.0.0.1[0]"):
        steps = [int(line.split()[1]) for line in out[wid] if line.startswith("STEP")]
        assert steps[0] == 0 and steps[-1] == 19 and steps == sorted(set(steps)), (wid, steps)


def _popen(*args, env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    full_env.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "hvdlite.runner.launch", *[str(a) for a in args]],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_host_added_by_discovery_joins_and_host_removed_leaves(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n127.0.0.1\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    env = {"ELASTIC_STEPS": "200", "ELASTIC_SLEEP": "0.03"}
    proc = _popen(
        "-np",
        2,
        "--min-np",
        2,
        "--max-np",
        3,
        "--host-discovery-script",
        script,
        sys.executable,
        SCRIPT,
        env=env,
    )
    timer = threading.Timer(150, proc.kill)
    timer.start()
    seen, lines = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            m = LINE.match(line.rstrip("\n"))
            if not m or not m.group(3).startswith("STEP "):
                continue
            size = int(m.group(3).split()[2])
            if not seen and size == 2:
                hosts.write_text("localhost\n127.0.0.1\n127.0.0.2:1\n")  # add a host
                seen.append(2)
            elif seen == [2] and size == 3:
                hosts.write_text("localhost\n127.0.0.1\n")  # remove it again
                seen.append(3)
        proc.wait(30)
    finally:
        timer.cancel()
        proc.kill()
    stderr = proc.stderr.read()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), stderr)
    assert res.returncode == 0, stderr[-4000:]
    log = check_exactly_once(res, 200)
    sizes = [size for _, size in log]
    changes = [sizes[0]] + [b for a, b in itertools.pairwise(sizes) if a != b]
    assert changes == [2, 3, 2], changes
    assert "generation 2: 3 worker(s): localhost[0], 127.0.0.1[0], 127.0.0.2[0]" in stderr
    assert "generation 3: 2 worker(s): localhost[0], 127.0.0.1[0]" in stderr
    out = worker_lines(res.stdout)
    # the new worker synced rank 0's state: its first step is the job's next one, not step 0
    joined = [int(line.split()[1]) for line in out["127.0.0.2[0]"] if line.startswith("STEP")]
    assert joined and joined[0] > 0 and joined[0] == sizes.index(3), (joined[:3], sizes.index(3))


def test_all_workers_failing_ends_the_job_with_horovods_message():
    env = {"ELASTIC_STEPS": "20", "ELASTIC_RAISE": "localhost[0]:3,127.0.0.1[0]:3,127.0.0.2[0]:3"}
    res = hvdliterun("-np", 3, "--min-np", 1, "-H", HOSTS3, sys.executable, SCRIPT, env=env)
    assert res.returncode == 1, res.stderr[-4000:]
    assert (
        "Horovod detected that one or more processes exited with non-zero status, thus causing "
        "the job to be terminated. The first process to do so was:\nProcess name: " in res.stderr
    ), res.stderr[-4000:]
    assert "Exit code: 1" in res.stderr


def test_reset_limit_is_honoured():
    env = {"ELASTIC_STEPS": "30", "ELASTIC_KILL": "127.0.0.3[0]:4,127.0.0.2[0]:12"}
    res = hvdliterun(
        "-np",
        4,
        "--min-np",
        1,
        "--reset-limit",
        1,
        "-H",
        HOSTS3 + ",127.0.0.3:1",
        sys.executable,
        SCRIPT,
        env=env,
    )
    assert res.returncode != 0
    assert "generation 2: 3 worker(s)" in res.stderr  # the first failure re-formed the job
    assert "generation 3" not in res.stderr.replace("generation 3 ", "")  # the second did not
    assert (
        "Horovod was shutdown because number of resets during elastic job exceeded limit: 1" in res.stderr
    ), res.stderr[-4000:]
    assert not any(line.startswith("DONE") for lines in worker_lines(res.stdout).values() for line in lines)


def test_survivors_below_min_np_wait_for_the_elastic_timeout_then_end():
    env = {"ELASTIC_STEPS": "20", "ELASTIC_KILL": "127.0.0.2[0]:4"}
    res = hvdliterun(
        "-np",
        3,
        "--min-np",
        3,
        "--elastic-timeout",
        2,
        "-H",
        HOSTS3,
        sys.executable,
        SCRIPT,
        env=env,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr[-4000:]
    assert (
        "Timed out waiting for minimum number of slots to become available. Please check that you "
        "have enough resources to run at least 3 Horovod processes." in res.stderr
    ), res.stderr[-4000:]
    assert "generation 2:" not in res.stderr
    # the survivors were told why, and none was left running (hvdliterun returned)
    err = worker_lines(res.stderr, "stderr")
    for wid in ("localhost[0]", "127.0.0.1[0]"):
        assert any("Timed out waiting for minimum number of slots" in line for line in err[wid]), err.get(wid)


@pytest.mark.slow
def test_blacklisted_host_returns_after_its_cooldown_with_a_new_worker():
    env = {"ELASTIC_STEPS": "150", "ELASTIC_SLEEP": "0.03", "ELASTIC_KILL": "127.0.0.2[0]:5"}
    res = hvdliterun(
        "-np",
        3,
        "--min-np",
        2,
        "--blacklist-cooldown-range",
        1,
        2,
        "-H",
        HOSTS3,
        sys.executable,
        SCRIPT,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    log = check_exactly_once(res, 150)
    sizes = [size for _, size in log]
    changes = [sizes[0]] + [b for a, b in itertools.pairwise(sizes) if a != b]
    assert changes == [3, 2, 3], changes
    assert "generation 3: 3 worker(s): localhost[0], 127.0.0.1[0], 127.0.0.2[0].1" in res.stderr, res.stderr[
        -3000:
    ]


@pytest.mark.slow
def test_generation_superseded_while_forming_is_skipped_by_its_workers(tmp_path):
    """A host is added (its worker starts slowly) and, while the others wait in init() for it,
    a survivor is SIGKILLed: the driver supersedes that generation; the waiting survivor and the
    slow newcomer both join the next one instead of failing."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n127.0.0.1\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts)
    script.chmod(0o755)
    env = {"ELASTIC_STEPS": "150", "ELASTIC_SLEEP": "0.03", "ELASTIC_START_DELAY": "127.0.0.2[0]:3"}
    proc = _popen("-np", 2, "--min-np", 1, "--host-discovery-script", script, sys.executable, SCRIPT, env=env)
    stderr = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    timer = threading.Timer(150, proc.kill)
    timer.start()
    lines, pids = [], {}

    def kill_when_forming():
        deadline = time.monotonic() + 60
        while not any("generation 2:" in x for x in stderr) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the survivors are in init(), waiting for the slow newcomer
        os.kill(pids["127.0.0.1[0]"], 9)

    killer = threading.Thread(target=kill_when_forming, daemon=True)
    killer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            if m.group(3).startswith("PID "):
                pids[m.group(1)] = int(m.group(3).split()[1])
            elif m.group(3).startswith("STEP ") and len(lines) < 5:
                hosts.write_text("localhost\n127.0.0.1\n127.0.0.2\n")
        proc.wait(30)
    finally:
        timer.cancel()
        proc.kill()
    reader.join(5)
    err = "".join(stderr)
    res = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), err)
    assert res.returncode == 0, err[-4000:]
    assert "generation 3: 2 worker(s): localhost[0], 127.0.0.2[0]" in err, err[-4000:]
    assert "generation 2 did not form" in err, err[-4000:]
    log = check_exactly_once(res, 150)
    assert log[-1][1] == 2
    joined = [int(x.split()[1]) for x in worker_lines(res.stdout)["127.0.0.2[0]"] if x.startswith("STEP")]
    assert joined and joined[0] > 0


@pytest.mark.slow
def test_keras_fit_with_the_elastic_callbacks_recovers_a_killed_worker(keras_env):
    pytest.importorskip("tensorflow")
    script = str(REPO / "tests" / "elastic_keras_train.py")
    env = dict(keras_env, ELASTIC_KILL="127.0.0.2[0]:1:3")
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, script, env=env, timeout=170)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "generation 2: 2 worker(s): localhost[0], 127.0.0.1[0]" in res.stderr
    out = worker_lines(res.stdout)
    done = {
        wid: next(x for x in out[wid] if x.startswith("DONE ")).split(" ", 3)
        for wid in ("localhost[0]", "127.0.0.1[0]")
    }
    # both survivors finished all 3 epochs in the 2-rank job, with the same weights
    assert [d[1:3] for d in done.values()] == [["3", "2"], ["3", "2"]], done
    assert done["localhost[0]"][3] == done["127.0.0.1[0]"][3]
    assert np.isfinite(np.array(json.loads(done["localhost[0]"][3])[0])).all()


def test_hosts_parsing_order_and_blacklist_cooldown():
    from hvdlite.runner import elastic_discovery as d

    assert d.parse_hosts("localhost:2,127.0.0.2,b:0", default_slots=3) == {
        "localhost": 2,
        "127.0.0.2": 3,
        "b": 0,
    }
    with pytest.raises(ValueError):
        d.parse_hosts("a:x")
    hosts = d.HostManager(d.FixedHosts({}), cooldown_range=(1, 1))
    assert hosts.apply({"a": 1, "b": 2}) and hosts.usable() == [("a", 1), ("b", 2)]
    assert not hosts.apply({"b": 2, "a": 1})  # same hosts: no change, order kept
    assert hosts.apply({"b": 2, "c": 1}) and [h for h, _ in hosts.usable()] == ["b", "c"]
    assert hosts.apply({"a": 1, "b": 2, "c": 1}) and [h for h, _ in hosts.usable()] == ["b", "c", "a"]
    hosts.blacklist("b")
    assert [h for h, _ in hosts.usable()] == ["c", "a"]
    time.sleep(1.05)  # cooldown 1 s: b returns, last
    assert hosts.apply({"a": 1, "b": 2, "c": 1}) and [h for h, _ in hosts.usable()] == ["c", "a", "b"]
    with pytest.raises(ValueError):
        d.HostManager(d.FixedHosts({}), cooldown_range=(5, 1))


def test_launcher_rejects_bad_elastic_arguments(tmp_path):
    res = hvdliterun("-np", 2, "--min-np", 3, sys.executable, "-c", "pass")
    assert res.returncode != 0 and "--min-np" in res.stderr
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    bad.chmod(0o755)
    res = hvdliterun("-np", 2, "--host-discovery-script", bad, sys.executable, "-c", "pass")
    assert res.returncode != 0 and "exited with status 3: broken" in res.stderr, res.stderr
    # Without an elastic flag, -H is the plain multi-host launcher (tests/test_multihost.py).
    res = hvdliterun("-np", 2, "-H", "localhost:2", sys.executable, "-c", "pass")
    assert res.returncode == 0, res.stderr


def test_failed_worker_is_replaced_on_a_spare_host_up_to_max_np():
    env = {"ELASTIC_STEPS": "30", "ELASTIC_KILL": "127.0.0.1[0]:6"}
    hosts = HOSTS3 + ",127.0.0.3:1"
    res = hvdliterun("-np", 3, "--min-np", 2, "--max-np", 3, "-H", hosts, sys.executable, SCRIPT, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "generation 1: 3 worker(s): localhost[0], 127.0.0.1[0], 127.0.0.2[0]" in res.stderr
    # survivors keep ranks 0 and 1; the replacement on the spare host is synced and is rank 2
    assert "generation 2: 3 worker(s): localhost[0], 127.0.0.2[0], 127.0.0.3[0]" in res.stderr
    log = check_exactly_once(res, 30)
    assert {size for _, size in log} == {3}
    steps = [int(x.split()[1]) for x in worker_lines(res.stdout)["127.0.0.3[0]"] if x.startswith("STEP")]
    assert steps and steps[0] >= 6 and steps[-1] == 29


# Slow (a failure variant, ~7 s): the default suite keeps the elastic reform cases.
@pytest.mark.slow
def test_stall_timeout_without_an_exit_reforms_the_same_workers():
    env = {
        "ELASTIC_STEPS": "20",
        "ELASTIC_STALL": "127.0.0.1[0]:6",
        "HVDLITE_STALL_CHECK_TIME_SECONDS": "1",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "2",
    }
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, SCRIPT, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "generation 2: 3 worker(s): localhost[0], 127.0.0.1[0], 127.0.0.2[0]" in res.stderr, res.stderr[
        -4000:
    ]
    log = check_exactly_once(res, 20)
    assert {size for _, size in log} == {3}


_PRINT_IDENTITY = (
    "import json, os; print('IDENTITY ' + json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('HVDLITE_', 'HOROVOD_')) and not k.endswith(('SECRET', 'ADDR', 'ID'))}))"
)


def _identities(res):
    return [
        json.loads(line.split("IDENTITY ", 1)[1]) for line in res.stdout.splitlines() if "IDENTITY " in line
    ]


def test_workers_see_horovods_identity_variables_in_elastic_and_static_mode():
    """Horovod's elastic scripts read HOROVOD_RANK and HOROVOD_HOSTNAME; both launchers export
    Horovod's names with hvdlite's values (hvdlite.common.job)."""
    elastic = hvdliterun(
        "-np", 3, "--min-np", 3, "-H", "localhost:2,127.0.0.1:1", sys.executable, "-c", _PRINT_IDENTITY
    )
    static = hvdliterun("-np", 2, sys.executable, "-c", _PRINT_IDENTITY)
    assert elastic.returncode == 0 and static.returncode == 0, elastic.stderr + static.stderr
    got = sorted(
        (
            int(e["HOROVOD_RANK"]),
            e["HOROVOD_SIZE"],
            e["HOROVOD_HOSTNAME"],
            e["HOROVOD_LOCAL_RANK"],
            e["HOROVOD_LOCAL_SIZE"],
        )
        + (e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"])
        for e in _identities(elastic)
    )
    assert got == [
        (0, "3", "localhost", "0", "2", "0", "2"),
        (1, "3", "localhost", "1", "2", "0", "1"),
        (2, "3", "127.0.0.1", "0", "1", "1", "2"),
    ]
    for env in _identities(elastic) + _identities(static):
        for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"):
            assert env["HOROVOD_" + name] == env["HVDLITE_" + name], (name, env)
    assert all("HOROVOD_HOSTNAME" not in e for e in _identities(static))  # the core's own identity
    import hvdlite as hvd

    state = hvd.elastic.ObjectState(epoch=0)  # outside an elastic job: no host updates
    assert state._host_messages.empty() and state._last_updated_timestamp == 0


@pytest.mark.slow
def test_compressor_residuals_survive_a_killed_worker():
    env = {"ELASTIC_KILL": "127.0.0.2[0]:5"}
    script = str(REPO / "tests" / "elastic_compression_train.py")
    res = hvdliterun("-np", 3, "--min-np", 2, "-H", HOSTS3, sys.executable, script, env=env, timeout=150)
    assert res.returncode == 0, res.stderr[-4000:]
    log, (first, last) = done_of(res)
    assert [step for step, _, _ in log] == list(range(len(log)))  # no committed step lost or repeated
    assert [size for _, size, _ in log][:5] == [3] * 5 and log[-1][1] == 2
    assert all(same for _, _, same in log)  # replicas identical after every step
    assert np.isfinite(first) and np.isfinite(last)  # 24 steps of batch 4: a state test, not convergence
    entries = {}
    for wid, lines in worker_lines(res.stdout).items():
        for line in lines:
            if line.startswith("RESIDUALS "):
                entries[wid] = json.loads(line[len("RESIDUALS ") :])
    assert sorted(entries) == ["127.0.0.1[0]", "localhost[0]"], sorted(entries)
    for wid, visits in entries.items():
        assert len(visits) == 2, (wid, visits)  # the start, and the re-entry after the reset
        step, restored, at_commit = visits[1]
        assert step == 5 and restored == at_commit and at_commit is not None, (wid, visits)
