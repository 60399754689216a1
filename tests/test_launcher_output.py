"""What a user sees of '\\r' progress bars through hvdliterun, on a terminal and through a pipe.

Each rank draws two bars on stderr the way tqdm does ('\\r' + state, no newline between
updates): one kept at its end ('\\n', tqdm's leave=True) and one erased at its end (blanks,
then '\\r': leave=False), then prints a line on stdout. A third test runs real tqdm. The first two run under hvdliterun and under hvdliterun --mpi.
"""

import errno
import fcntl
import os
import re
import select
import shutil
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from test_launcher import HVDLITERUN, LINE, python

REPO = Path(__file__).resolve().parent.parent
TOTAL = 23

BARS = r"""
import os, sys, time
r = os.environ.get("HVDLITE_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]  # hvdliterun's or --mpi's
def bar(name, total, leave):
    width = 0
    for i in range(total + 1):
        state = "%s %3d%%|%-23s| %d/%d" % (name, 100 * i // total, "#" * i, i, total)
        sys.stderr.write("\r" + state)
        sys.stderr.flush()
        width = len(state)
        time.sleep(0.02)  # apart enough that the launcher reads several states
    sys.stderr.write("\n" if leave else "\r" + " " * width + "\r")
    sys.stderr.flush()
bar("kept", 23, True)
print("between-" + r, flush=True)
bar("erased", 23, False)
print("done-" + r, flush=True)
"""
BAR_STATE = re.compile(r"^(kept|erased) +\d+%\|#*\s*\| (\d+)/23$")


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_", "OMPI_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _run_in_pty(args, timeout=60.0):
    """Runs hvdliterun with stdout and stderr on one pseudo-terminal; returns (code, bytes)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # rows, columns
    os.set_blocking(master, False)
    proc = subprocess.Popen(args, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    data = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                if proc.poll() is not None and not _readable(master):
                    break
                time.sleep(0.01)
                continue
            except OSError as e:  # EIO: every writer closed the terminal
                if e.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            data += chunk
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), bytes(data)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def _readable(fd):
    return bool(select.select([fd], [], [], 0.2)[0])


def _screen(data):
    """The rows a terminal shows after `data`: '\\r', '\\n' and ESC[K interpreted (enough for
    what hvdliterun writes; the pty adds '\\r' before each '\\n')."""
    rows, row, col = [], [], 0
    i, text = 0, data.decode("utf-8", "replace")
    while i < len(text):
        c = text[i]
        if text.startswith("\x1b[K", i):
            del row[col:]
            i += 3
            continue
        if c == "\r":
            col = 0
        elif c == "\n":
            rows.append("".join(row).rstrip())
            row, col = [], 0
        else:
            row[col : col + 1] = [c]
            col += 1
        i += 1
    if "".join(row).strip():
        rows.append("".join(row).rstrip())
    return rows


def _by_rank(rows):
    out = {}
    for row in rows:
        m = LINE.match(row)
        assert m, "a row without a rank prefix: %r" % row
        out.setdefault((int(m.group(1)), m.group(2)), []).append(m.group(3))
    return out


# hvdliterun's own ranks, and ranks started by mpirun (--mpi): the same output policy.
LAUNCHERS = pytest.mark.parametrize(
    "launcher",
    [
        [],
        pytest.param(
            ["--mpi"], marks=pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
        ),
    ],
    ids=["local", "mpi"],
)


@LAUNCHERS
def test_bars_on_a_terminal_update_in_place_with_the_rank_prefix(launcher):
    code, data = _run_in_pty(HVDLITERUN + launcher + ["-np", "2"] + python(BARS))
    rows = _screen(data)
    assert code == 0, rows
    lines = _by_rank(rows)
    for r in (0, 1):
        # Final screen: the kept bar at 23/23 once, the erased bar gone, stdout lines in place.
        assert lines[(r, "stderr")] == ["kept 100%|#######################| 23/23"], rows
        assert lines[(r, "stdout")] == ["between-%d" % r, "done-%d" % r], rows
        # Live updates were drawn: each '\r' state re-emitted after an erase, with its prefix.
        drawn = re.findall(rb"\r\x1b\[K\[%d\]<stderr>:kept +\d+%%\|#*\s*\| (\d+)/23" % r, data)
        assert drawn and int(drawn[-1]) == TOTAL and len(set(drawn)) > 1, data[-2000:]
    assert all(len(row) < 200 for row in rows)


@LAUNCHERS
def test_bars_through_a_pipe_print_whole_lines_with_the_final_state(launcher):
    res = subprocess.run(
        HVDLITERUN + launcher + ["-np", "2"] + python(BARS),
        cwd=REPO,
        env=_env(),
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert b"\r" not in res.stdout + res.stderr and b"\x1b" not in res.stdout + res.stderr
    lines = _by_rank(res.stdout.decode().splitlines() + res.stderr.decode().splitlines())
    for r in (0, 1):
        assert lines[(r, "stdout")] == ["between-%d" % r, "done-%d" % r]
        bars = lines[(r, "stderr")]
        states = [BAR_STATE.match(b) for b in bars]
        assert all(states), bars
        # Only snapshots (at most one per PIPE_PROGRESS_INTERVAL_S) and each bar's final state:
        # the erased bar's last state is kept in the log too.
        assert [s.group(1) for s in states if s.group(2) == "23"] == ["kept", "erased"], bars
        assert len(bars) < 2 * TOTAL, bars


def test_real_tqdm_with_postfix_ends_at_its_total():
    code = (
        "import os, time; from tqdm import tqdm\n"
        "r = os.environ['HVDLITE_RANK']\n"
        "bar = tqdm(range(23), desc='epoch 0', disable=r != '0', mininterval=0, leave=True)\n"
        "for i in bar:\n"
        "    bar.set_postfix(loss='%.3f' % (1.0 / (i + 1))); time.sleep(0.002)\n"
        "bar.close(); print('end-' + r)\n"
    )
    res = subprocess.run(
        HVDLITERUN + ["-np", "2"] + python(code), cwd=REPO, env=_env(), capture_output=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    err = res.stderr.decode().splitlines()
    assert all(len(line) < 300 for line in err), err
    final = [line for line in err if line.startswith("[0]<stderr>:epoch 0: 100%") and "23/23" in line]
    assert len(final) == 1 and "loss=0.043" in final[0], err
    assert not [line for line in err if line.startswith("[1]")], err
    assert sorted(res.stdout.decode().splitlines()) == ["[0]<stdout>:end-0", "[1]<stdout>:end-1"]
