"""hvdliterun as a user runs it: a subprocess, its ranks, their output and exit codes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HVDLITERUN = [sys.executable, "-m", "hvdlite.runner.launch"]
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


def hvdliterun(*args, timeout=60):
    """Runs hvdliterun to completion (bounded); returns the CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    return subprocess.run(
        HVDLITERUN + [str(a) for a in args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rank_lines(text, stream="stdout"):
    """{rank: [line, ...]} of the prefixed lines of `stream` in text."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(2) == stream:
            out.setdefault(int(m.group(1)), []).append(m.group(3))
    return out


def python(code):
    return [sys.executable, "-c", code]


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_for_files(directory, count, timeout=30.0):
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(name) for name in os.listdir(directory)]


def test_output_lines_are_prefixed_with_the_rank():
    code = (
        "import os, sys; r = os.environ['HVDLITE_RANK']; print('out-' + r); "
        "print('err-' + r, file=sys.stderr); sys.stdout.write('tail-' + r)"
    )
    res = hvdliterun("-np", 2, *python(code))
    assert res.returncode == 0, res.stderr
    assert rank_lines(res.stdout) == {0: ["out-0", "tail-0"], 1: ["out-1", "tail-1"]}
    assert rank_lines(res.stderr, "stderr") == {0: ["err-0"], 1: ["err-1"]}


def test_ranks_get_their_environment():
    code = (
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith('HVDLITE_') or k == 'PYTHONUNBUFFERED'}))"
    )
    res = hvdliterun("-np", 3, *python(code))
    assert res.returncode == 0, res.stderr
    envs = {r: json.loads(lines[0]) for r, lines in rank_lines(res.stdout).items()}
    assert sorted(envs) == [0, 1, 2]
    for rank, env in envs.items():
        assert env["HVDLITE_RANK"] == env["HVDLITE_LOCAL_RANK"] == str(rank)
        assert env["HVDLITE_SIZE"] == env["HVDLITE_LOCAL_SIZE"] == "3"
        assert (env["HVDLITE_CROSS_RANK"], env["HVDLITE_CROSS_SIZE"]) == ("0", "1")
        assert env["PYTHONUNBUFFERED"] == "1"
        assert re.fullmatch(r"127\.0\.0\.1:\d+", env["HVDLITE_STORE_ADDR"])
        assert re.fullmatch(r"[0-9a-f]{64}", env["HVDLITE_SECRET"])
        assert "HVDLITE_LOG_LEVEL" not in env
    assert len({e["HVDLITE_SECRET"] for e in envs.values()}) == 1
    assert len({e["HVDLITE_STORE_ADDR"] for e in envs.values()}) == 1


def test_verbose_sets_debug_logging():
    code = "import os; print(os.environ.get('HVDLITE_LOG_LEVEL'))"
    res = hvdliterun("--verbose", "-np", 1, *python(code))
    assert res.returncode == 0, res.stderr
    assert rank_lines(res.stdout) == {0: ["debug"]}


def test_first_failure_stops_the_job_and_sets_the_exit_code(tmp_path):
    # Ranks 0 and 2 record their pid and sleep; rank 1 waits for them, then exits 3.
    code = (
        "import os, sys, time; r = int(os.environ['HVDLITE_RANK']); d = sys.argv[1]\n"
        "if r == 1:\n"
        "    end = time.time() + 30\n"
        "    while len(os.listdir(d)) < 2 and time.time() < end: time.sleep(0.05)\n"
        "    sys.exit(3)\n"
        "open(os.path.join(d, str(os.getpid())), 'w').close()\n"
        "time.sleep(60)\n"
    )
    res = hvdliterun("-np", 3, *python(code), tmp_path, timeout=45)
    assert res.returncode == 3, res.stderr
    assert "rank 1 exited with code 3" in res.stderr
    sleepers = [int(name) for name in os.listdir(tmp_path)]
    assert len(sleepers) == 2 and all(gone(pid) for pid in sleepers)


def test_a_rank_killed_by_a_signal_fails_the_job():
    code = (
        "import os, signal, time\n"
        "if os.environ['HVDLITE_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    res = hvdliterun("-np", 2, *python(code), timeout=45)
    assert res.returncode == 1
    assert "rank 1 was killed by signal 9 (SIGKILL)" in res.stderr


def test_sigint_is_forwarded_to_every_rank(tmp_path):
    code = (
        "import os, sys, time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); time.sleep(60)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDLITE_")}
    proc = subprocess.Popen(
        HVDLITERUN + ["-np", "2"] + python(code) + [str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ranks = wait_for_files(tmp_path, 2)
        assert len(ranks) == 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "got SIGINT" in err
    assert all(gone(pid) for pid in ranks)


def test_usage_errors():
    assert hvdliterun(*python("pass")).returncode == 2  # no -np
    assert hvdliterun("-np", 2).returncode == 2  # no command
    assert hvdliterun("-np", 0, *python("pass")).returncode == 2
    res = hvdliterun("-np", 1, "/nonexistent/program")
    assert res.returncode == 127 and "cannot start" in res.stderr


def test_check_build_lists_frameworks_and_backends():
    from hvdlite import _core

    res = hvdliterun("--check-build")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for section in ("Available Frameworks:", "Available Controllers:", "Available Tensor Operations:"):
        assert section in out
    assert "[X] NumPy" in out and "[X] Ring" in out
    info = _core.build_info()
    for label, key in (("MPI", "mpi"), ("NCCL", "nccl"), ("CUDA", "cuda")):
        assert ("[X] " if info[key] else "[ ] ") + label in out


def test_ranks_rendezvous_and_reduce():
    code = (
        "import numpy as np, hvdlite as hvd; hvd.init(); "
        "out = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name='x'); "
        "print('sum', out[0], hvd.rank(), hvd.size()); hvd.shutdown()"
    )
    res = hvdliterun("-np", 2, *python(code))
    assert res.returncode == 0, res.stderr
    assert rank_lines(res.stdout) == {0: ["sum 3.0 0 2"], 1: ["sum 3.0 1 2"]}


@pytest.mark.slow
def test_numpy_digits_example_learns():
    res = hvdliterun(
        "-np", 2, sys.executable, REPO / "examples" / "numpy_digits.py", "--epochs", 3, timeout=120
    )
    assert res.returncode == 0, res.stderr
    lines = rank_lines(res.stdout)
    assert 1 not in lines, "only rank 0 prints"
    assert [line.split(":")[0] for line in lines[0][:3]] == ["epoch 1", "epoch 2", "epoch 3"]
    match = re.fullmatch(r"test accuracy: ([0-9.]+) \(2 ranks, 3 epochs\)", lines[0][-1])
    assert match, lines[0]
    assert float(match.group(1)) > 0.9
