"""Horovod 0.28.1's elastic integration scenarios (test/integration/elastic_common.py), driven
through the `horovodrun` command line against hvdlite: a developer and CI tool.

    python tests/horovod_elastic.py [torch|tensorflow2] [SCENARIO ...] [--legacy-keras]

Horovod's harness calls its runner's private functions (parse_args, _run_elastic) with some
driver constants patched; here each run is the command line that harness prints, run as a
process: `horovodrun -np N --min-num-proc M --log-level DEBUG (--host-discovery-script S
--max-num-proc X | -H HOSTS) [--reset-limit R] [--blacklist-cooldown-range A B] python SCRIPT
--logfile L ...`, with the discovery intervals left at their defaults. Where Horovod patches
ELASTIC_TIMEOUT_SECS to 1 the run passes `--elastic-timeout 1`, the same setting on the command
line. The training scripts, test/integration/data/elastic_torch_main.py and
elastic_tensorflow2_main.py, come unchanged from HOROVOD_SRC or the local mirror
(tests/horovod_suite.py finds them; nothing of Horovod is in this repository).

A scenario is one or more runs, each with what Horovod's test asserts: either the per-epoch log
lines rank 0 wrote (start_rank, size, hostname, rendezvous of given lines), or that the job
failed (non-zero exit) with a given message in its output, Horovod's RuntimeError message.
run_scenario() returns the problems found (empty: passed).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import horovod_suite

SCRIPTS = {
    "torch": "test/integration/data/elastic_torch_main.py",
    "tensorflow2": "test/integration/data/elastic_tensorflow2_main.py",
}
NONZERO = "Horovod detected that one or more processes exited with non-zero status"
RESET_LIMIT_1 = "Horovod was shutdown because number of resets during elastic job exceeded limit: 1"
TWO_HOSTS = [(None, ["localhost:2", "127.0.0.1:2"])]
ADD_REMOVE = [(0, ["localhost:2"]), (1, ["localhost:2", "127.0.0.1:2"]), (None, ["127.0.0.1:2"])]
FAILED_RANK_0 = [(0, 4, 1), (2, 2, 2), (2, 2, 2)]  # (start_rank, size, rendezvous) per log line


def _add_remove(slots):
    hosts = [(0, ["localhost:%d" % slots]), (1, ["localhost:%d" % slots, "127.0.0.1:%d" % slots])]
    return hosts + [(None, ["127.0.0.1:%d" % slots])]


def _added_removed_lines(slots):
    return [
        {"start_rank": 0, "size": slots, "hostname": "localhost"},
        {"start_rank": 0, "size": slots * 2, "hostname": "localhost"},
        {"start_rank": slots, "size": slots, "hostname": "127.0.0.1", "rendezvous": 3},
    ]


def _lines(triples):
    return [{"start_rank": s, "size": n, "rendezvous": r} for s, n, r in triples]


# name -> [(run arguments, expectation)]; an expectation is {"lines": [...], "count": n} or
# {"fails_with": message}. Run arguments are elastic_common._run's keyword arguments.
SCENARIOS = {
    "test_hosts_added_and_removed": [
        (
            dict(discovery_schedule=_add_remove(s), num_proc=n, min_num_proc=lo, max_num_proc=hi),
            {"count": 3, "lines": _added_removed_lines(s)},
        )
        for s, n, lo, hi in [(2, 2, 2, 4), (1, 1, 1, 2)]
    ],
    "test_single_rank_failure": [
        (
            dict(discovery_schedule=TWO_HOSTS, exit_schedule={"(1, 0)": [0]}, exit_mode=mode),
            {"count": 3, "lines": _lines(FAILED_RANK_0)},
        )
        for mode in ("exception", "kill")
    ],
    "test_fault_tolerance_without_scaling": [
        (
            dict(hosts="localhost:2,127.0.0.1:2", exit_schedule={"(1, 0)": [0]}, exit_mode=mode),
            {"count": 3, "lines": _lines(FAILED_RANK_0)},
        )
        for mode in ("exception", "kill")
    ],
    "test_all_ranks_failure": [
        (dict(discovery_schedule=TWO_HOSTS, exit_schedule={"(1, 0)": [0, 1, 2, 3]}), {"fails_with": NONZERO})
    ],
    "test_all_hosts_blacklisted": [
        (dict(discovery_schedule=TWO_HOSTS, exit_schedule={"(1, 0)": [0, 2]}), {"fails_with": NONZERO})
    ],
    # Horovod's harness passes np=4, which its _run does not take (it means num_proc=4).
    "test_min_hosts_timeout": [
        (
            dict(
                discovery_schedule=TWO_HOSTS,
                exit_schedule={"(1, 0)": [0]},
                num_proc=4,
                min_num_proc=4,
                elastic_timeout=1,
            ),
            {"fails_with": NONZERO},
        )
    ],
    "test_reset_limit": [
        (
            dict(discovery_schedule=ADD_REMOVE, reset_limit=1, elastic_timeout=1),
            {"fails_with": RESET_LIMIT_1},
        ),
        (dict(discovery_schedule=ADD_REMOVE, reset_limit=2, elastic_timeout=1), {"count": 3, "lines": []}),
    ],
    "test_resurrecting_blacklisted_hosts_exponential_backoff": [
        (
            dict(
                discovery_schedule=TWO_HOSTS,
                exit_schedule={"(1, 0)": [3], "(3, 0)": [3]},
                exit_mode="exception",
                epoch_wait=0.25,
                epochs=5,
                cooldown_range=[1, 2],
            ),
            {
                "count": 5,
                "lines": _lines([(0, 4, 1), (0, 2, 2), (0, 2, 2)]),
                "line_4": _lines([(0, 2, 2)])[0],
            },
        )
    ],
}


def discovery_script(logfile, schedule):
    """A bash discovery script printing the hosts of `schedule` ([(epoch or None, [host:slots])],
    the last entry the default) for the current epoch: the number of lines in `logfile`."""
    lines = ["#!/bin/bash", "epoch=0", 'if [ -f "%s" ]; then epoch=$(wc -l < "%s"); fi' % (logfile, logfile)]
    lines.append('case "$((epoch))" in')
    for epoch, hosts in schedule[:-1]:
        lines.append("  %d) printf '%%s\\n' %s ;;" % (epoch, " ".join(hosts)))
    lines.append("  *) printf '%%s\\n' %s ;;" % " ".join(schedule[-1][1]))
    lines.append("esac")
    return "\n".join(lines) + "\n"


def command(script, logfile, discovery, a):
    """The horovodrun command line of one run (elastic_common._run's), as a list."""
    cmd = ["horovodrun", "-np", str(a.get("num_proc", 2)), "--min-num-proc", str(a.get("min_num_proc", 2))]
    cmd += ["--log-level", "DEBUG"]
    if a.get("hosts") is not None:
        cmd += ["-H", a["hosts"]]
    else:
        cmd += ["--host-discovery-script", discovery, "--max-num-proc", str(a.get("max_num_proc", 4))]
    if a.get("reset_limit") is not None:
        cmd += ["--reset-limit", str(a["reset_limit"])]
    if a.get("cooldown_range") is not None:
        cmd += ["--blacklist-cooldown-range"] + [str(v) for v in a["cooldown_range"]]
    if a.get("elastic_timeout") is not None:  # Horovod's harness patches ELASTIC_TIMEOUT_SECS
        cmd += ["--elastic-timeout", str(a["elastic_timeout"])]
    cmd += ["python", script, "--logfile", logfile]
    for flag, key in (("--discovery-schedule", "discovery_schedule"), ("--epoch-wait", "epoch_wait")):
        if a.get(key):
            cmd += [flag, json.dumps(a[key])]
    if a.get("epochs"):
        cmd += ["--epochs", json.dumps(a["epochs"])]
    if a.get("exit_schedule"):
        cmd += [
            "--exit-schedule",
            json.dumps(a["exit_schedule"]),
            "--exit-mode",
            a.get("exit_mode", "exception"),
        ]
    return cmd


def _env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    bin_dir = os.path.dirname(sys.executable)  # `python` in the command line: this interpreter
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    paths = [str(horovod_suite.REPO / "compat" / "src"), str(horovod_suite.REPO)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env.update({"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"})
    env.update(extra or {})
    return env


def run_once(script, a, workdir, env=None, timeout=300):
    """Runs one scenario run; returns (exit code, output, [log line dicts])."""
    logfile = os.path.join(
        workdir, "log.%d.txt" % len([n for n in os.listdir(workdir) if n.endswith(".txt")])
    )
    discovery = logfile + ".discover.sh"
    schedule = a.get("discovery_schedule") or [(None, a["hosts"].split(","))]
    Path(discovery).write_text(discovery_script(logfile, schedule))
    os.chmod(discovery, 0o755)
    cmd = command(script, logfile, discovery, a)
    argv = [sys.executable, "-m", "horovod.runner.launch"] + cmd[1:]  # horovodrun's entry point
    try:
        out = subprocess.run(argv, env=_env(env), capture_output=True, text=True, timeout=timeout)
        code, text = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as e:
        code, text = -1, "%s\n[ran past %d s and was stopped]" % (e.stdout or "", timeout)
    lines = [json.loads(x) for x in Path(logfile).read_text().splitlines()] if os.path.exists(logfile) else []
    return code, "$ " + " ".join(cmd) + "\n" + text, lines


def judge(expect, code, output, lines):
    """The problems of one run against its expectation (empty: as Horovod's test asserts)."""
    if "fails_with" in expect:
        if code == 0:
            return ["the job succeeded; Horovod's test expects RuntimeError %r" % expect["fails_with"]]
        return [] if expect["fails_with"] in output else ["no %r in the output" % expect["fails_with"]]
    problems = [] if code == 0 else ["the job failed with exit code %d" % code]
    if len(lines) != expect["count"]:
        problems.append("%d log lines, want %d: %s" % (len(lines), expect["count"], lines))
    want = dict(enumerate(expect["lines"]))
    if "line_4" in expect:
        want[4] = expect["line_4"]
    for i, fields in want.items():
        got = lines[i] if i < len(lines) else {}
        bad = {k: (got.get(k), v) for k, v in fields.items() if got.get(k) != v}
        if bad:
            problems.append("log line %d: {field: (got, want)} %s" % (i, bad))
    return problems


def run_scenario(name, framework="torch", env=None, src=None, timeout=300):
    """[(command line, problems, output)] of every run of scenario `name`."""
    found = horovod_suite.source(src)
    if found is None:
        raise FileNotFoundError(horovod_suite.available(src))
    out = []
    with tempfile.TemporaryDirectory(prefix="horovod-elastic-") as tmp:
        script = os.path.join(tmp, os.path.basename(SCRIPTS[framework]))
        Path(script).write_text(horovod_suite._read(*found, horovod_suite.REF, SCRIPTS[framework]))
        runs = os.path.join(tmp, "runs")
        os.mkdir(runs)
        for a, expect in SCENARIOS[name]:
            code, output, lines = run_once(script, a, runs, env, timeout)
            out.append((output.splitlines()[0], judge(expect, code, output, lines), output))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("framework", choices=sorted(SCRIPTS))
    p.add_argument("scenarios", nargs="*", help="default: all (%s)" % ", ".join(SCENARIOS))
    p.add_argument("--legacy-keras", action="store_true", help="TF_USE_LEGACY_KERAS=1 (needs tf_keras)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every run's output")
    args = p.parse_args(argv)
    reason = horovod_suite.available()
    if reason:
        print("horovod_elastic: skipped: " + reason)
        return 0
    env = {"TF_USE_LEGACY_KERAS": "1"} if args.legacy_keras else {}
    failed = 0
    for name in args.scenarios or SCENARIOS:
        for cmd, problems, output in run_scenario(name, args.framework, env):
            failed += bool(problems)
            print("%s %s\n  %s" % ("FAILED" if problems else "passed", name, cmd))
            for problem in problems:
                print("    " + problem)
            if args.verbose or problems:
                print("    " + output[-4000:].replace("\n", "\n    "))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
