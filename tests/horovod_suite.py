"""Runs one of Horovod's own test files, unchanged, against hvdlite: a developer and CI tool.

    python tests/horovod_suite.py test_tensorflow.py [--np 2] [--mode file|each] [--timeout 300]
        [--env K=V ...] [--legacy-keras] [-k EXPR] [--json FILE] [--src DIR] [--ref v0.28.1]
        [--launcher hvdliterun|horovodrun|mpirun]
    make horovod-suite SUITE=test_tensorflow.py           # the same, HOROVOD_SRC or the mirror

Horovod's sources are never copied into this repository. They come from HOROVOD_SRC (a Horovod
checkout, or a bare git directory of one) or else the local mirror MIRROR; `available()` says why
not when neither is there, and tests skip with that reason. At REF (Horovod 0.28.1) the test file,
test/parallel/base_test_*.py, test/utils/common.py and test/conftest.py are written into a
temporary directory laid out as Horovod's test/ tree, and run as Horovod's CI runs them: from
test/parallel, `pytest -v` on the whole file in every rank, the ranks started by hvdliterun (or
horovodrun, or mpirun: --launcher) with the opt-in `horovod` namespace of compat/src on the path. Horovod's tests import the `parameterized` and
`mock` packages: requirements-dev.txt installs both.

Modes: "file" is one pytest run of the whole file (tests share the process, as in Horovod's CI);
after a hang the run resumes with the tests not yet run, so one hang costs one test. "each" runs
every test in its own job (isolation, for bisecting an interaction).

A test's outcome joins its ranks' outcomes: failed if any rank failed, hang if any rank was still
in it when the per-test timeout (tests/horovod_suite_plugin.py) stopped the job, skipped if skipped
on every rank, else passed.

Library use: `run_suite("test_tensorflow.py", np=2, env={...})` returns a SuiteResult
(.tests: nodeid -> Outcome; .counts(); .summary()).
"""

import argparse
import ast
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
MIRROR = Path("/work/.mirror/horovod+horovod/repo")
REF = "v0.28.1"
HELPERS = ["test/conftest.py", "test/utils/common.py"]
RANK_OF = {"failed": 3, "hang": 2, "passed": 1, "skipped": 0}  # the worst rank's outcome wins


@dataclasses.dataclass
class Outcome:
    outcome: str  # passed | failed | skipped | hang
    reason: str = ""


@dataclasses.dataclass
class SuiteResult:
    test_file: str
    tests: dict  # nodeid -> Outcome, in the order the tests ran
    launches: int = 0
    log_tail: str = ""  # the end of the last launch's output (for a failure with no test record)

    def counts(self):
        out = {k: 0 for k in RANK_OF}
        for o in self.tests.values():
            out[o.outcome] += 1
        return out

    def named(self, outcome):
        return {n: o.reason for n, o in self.tests.items() if o.outcome == outcome}

    def summary(self):
        lines = ["%s: %s (%d launches)" % (self.test_file, self.counts(), self.launches)]
        for kind in ("failed", "hang"):
            for nodeid, reason in self.named(kind).items():
                lines.append("  %s %s\n      %s" % (kind.upper(), nodeid, reason.replace("\n", "\n      ")))
        return "\n".join(lines)


def source(src=None):
    """(kind, path) of the Horovod sources: kind "git" for a git directory, "tree" for a checkout
    work tree; None when there are none. src: this path only; else HOROVOD_SRC, then MIRROR."""
    for cand in [src] if src else [os.environ.get("HOROVOD_SRC"), str(MIRROR)]:
        if not cand:
            continue
        p = Path(cand)
        if (p / "test" / "parallel").is_dir():
            return "tree", p
        if (p / "HEAD").is_file() or (p / ".git").exists():
            return "git", p
    return None


def available(src=None):
    """None when Horovod's sources are there; else the reason a test skips."""
    if source(src) is None:
        return (
            "Horovod's sources are not available: set HOROVOD_SRC to a Horovod checkout "
            "(git clone https://github.com/horovod/horovod; tests use %s) or a bare git directory of "
            "one; nothing of Horovod is vendored in this repository" % REF
        )
    return None


def _read(kind, path, ref, name):
    if kind == "tree":
        return (path / name).read_text()
    out = subprocess.run(
        ["git", "-C", str(path), "show", "%s:%s" % (ref, name)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise FileNotFoundError("%s:%s in %s: %s" % (ref, name, path, out.stderr.strip()))
    return out.stdout


def _list_parallel(kind, path, ref):
    if kind == "tree":
        return sorted(p.name for p in (path / "test" / "parallel").iterdir())
    out = subprocess.run(
        ["git", "-C", str(path), "ls-tree", "--name-only", ref, "test/parallel/"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(Path(line).name for line in out.stdout.split())


def extract(test_file, dest, src=None, ref=REF):
    """Writes the test file and its helpers under dest/test/ (Horovod's layout); returns the path
    of the test file. A checkout work tree is used as it is (ref applies to git directories)."""
    found = source(src)
    if found is None:
        raise FileNotFoundError(available(src))
    kind, path = found
    names = HELPERS + [
        "test/parallel/" + n for n in _list_parallel(kind, path, ref) if n.startswith("base_test_")
    ]
    names.append("test/parallel/" + test_file)
    for name in names:
        target = Path(dest) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_read(kind, path, ref, name))
    return Path(dest) / "test" / "parallel" / test_file


def test_names(test_file, pattern, src=None, ref=REF):
    """Sorted names of test_file's test functions (methods included) whose source text matches
    the regular expression `pattern` (re.search); the file is read as extract() reads it."""
    found = source(src)
    if found is None:
        raise FileNotFoundError(available(src))
    text = _read(*found, ref, "test/parallel/" + test_file)
    return sorted(
        node.name
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
        and re.search(pattern, ast.get_source_segment(text, node) or "")
    )


def _env(extra, log_dir, timeout, deselect):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    path = [str(TESTS), str(REPO / "compat" / "src"), str(REPO)]
    env.update({"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "0"})
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(
        {
            "HVDLITE_SUITE_LOG": str(log_dir),
            "HVDLITE_SUITE_TIMEOUT": str(timeout),
            "HVDLITE_SUITE_DESELECT": deselect,
        }
    )
    return env


LAUNCHERS = ("hvdliterun", "horovodrun", "mpirun")


def launcher_argv(launcher, np):
    """The argv prefix that starts np ranks: hvdliterun; horovodrun as Horovod's CI runs
    test/parallel (`horovodrun -np N -H localhost:N`, the compat namespace's console script
    run as its module); or mpirun as Horovod's MPI pipeline does (mpirun -np N, with the
    flags hvdliterun --mpi adds)."""
    if launcher == "hvdliterun":
        return [sys.executable, "-m", "hvdlite.runner.launch", "-np", str(np)]
    if launcher == "horovodrun":
        return [sys.executable, "-m", "horovod.runner.launch", "-np", str(np), "-H", "localhost:%d" % np]
    if launcher == "mpirun":
        from hvdlite.runner import mpi_launch

        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise FileNotFoundError("launcher mpirun: no mpirun on PATH")
        return mpi_launch.mpirun_command(np, [], mpirun=mpirun)
    raise ValueError("launcher must be one of %s, got %r" % (LAUNCHERS, launcher))


def _launch(test_path, np, env, select, wall_limit, launcher="hvdliterun"):
    """One job of pytest on np ranks; returns its combined output (the end of it)."""
    cmd = launcher_argv(launcher, np) + [sys.executable, "-m", "pytest"]
    if launcher == "mpirun":
        from hvdlite.runner import mpi_launch

        env = mpi_launch.mpirun_env(env)
    cmd += ["-v", "-p", "horovod_suite_plugin", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    # select: node ids ("each" mode) replace the file argument; other pytest arguments follow it.
    if select and all("::" in a for a in select):
        cmd += ["-rs"] + list(select)
    else:
        cmd += ["-rs", test_path.name] + list(select or [])
    try:
        out = subprocess.run(
            cmd, cwd=test_path.parent, env=env, capture_output=True, text=True, timeout=wall_limit
        )
        return (out.stdout + out.stderr)[-20000:]
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return text[-20000:] + "\n[horovod_suite: the job ran past %ss and was stopped]" % wall_limit


def _join(records):
    """One rank's outcome of one test from its reports: failed if any failed; skipped if the test
    skipped, or every subtest of it did (Horovod's GPU tests skip in each execution mode); else
    passed."""
    failed = [r for r in records if r["outcome"] == "failed"]
    if failed:
        return Outcome("failed", failed[0]["reason"])
    skipped = [r for r in records if r["outcome"] == "skipped"]
    subs = [r for r in records if r.get("sub")]
    if skipped and all(r["outcome"] == "skipped" for r in subs):
        return Outcome("skipped", skipped[0]["reason"])
    return Outcome("passed")


def _merge(log_dir, np, tests):
    """Folds this launch's rank logs into tests; returns the node ids that started."""
    started = []
    per_rank = []
    for r in range(np):
        f = Path(log_dir) / ("rank.%d.jsonl" % r)
        recs = [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []
        per_rank.append(recs)
        started += [rec["start"] for rec in recs if "start" in rec and rec["start"] not in started]
    for nodeid in started:
        outs = []
        for recs in per_rank:
            done = [rec for rec in recs if rec.get("nodeid") == nodeid]
            ran = any(rec.get("start") == nodeid for rec in recs)
            if done:
                outs.append(_join(done))
            elif ran:
                outs.append(
                    Outcome(
                        "hang",
                        "did not finish: past the per-test timeout, or the rank died (see the job output)",
                    )
                )
        if outs:
            tests[nodeid] = max(outs, key=lambda o: RANK_OF[o.outcome])
    return started


def run_suite(
    test_file,
    np=2,
    env=None,
    timeout=300,
    mode="file",
    select=None,
    src=None,
    ref=REF,
    workdir=None,
    launcher="hvdliterun",
):
    """Runs Horovod's test_file on np ranks; see the module doc. env: extra environment for every
    rank (e.g. {"TF_USE_LEGACY_KERAS": "1"}); timeout: seconds per test; select: extra pytest
    arguments (e.g. ["-k", "allreduce"]) in "file" mode, node ids in "each" mode; launcher: one
    of LAUNCHERS (launcher_argv)."""
    run = functools.partial(_one_launch, launcher=launcher)
    with tempfile.TemporaryDirectory(prefix="horovod-suite-", dir=workdir) as tmp:
        test_path = extract(test_file, tmp, src, ref)
        result = SuiteResult(test_file, {})
        if mode == "each":
            ids = select or collect(test_path, env)
            for nodeid in ids:
                run(result, test_path, np, env, timeout, [nodeid], tmp)
            return result
        while True:
            started = run(result, test_path, np, env, timeout, select, tmp)
            if not started or result.tests.get(started[-1], Outcome("")).outcome != "hang":
                return result


def _one_launch(result, test_path, np, env, timeout, select, tmp, launcher="hvdliterun"):
    log_dir = Path(tempfile.mkdtemp(prefix="log-", dir=tmp))
    deselect = log_dir / "deselect.txt"
    deselect.write_text("\n".join(result.tests))
    run_env = _env(env, log_dir, timeout, str(deselect))
    wall = timeout * 50 + 600  # a backstop only: the per-test timeout ends a hung test first
    result.log_tail = _launch(test_path, np, run_env, select, wall, launcher)
    result.launches += 1
    return _merge(log_dir, np, result.tests)


def collect(test_path, env=None):
    """The node ids of test_path, in order (collected in one process, no job)."""
    run_env = _env(env, test_path.parent, 0, "")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", test_path.name],
        cwd=test_path.parent,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    ids = [line for line in out.stdout.splitlines() if line.startswith(test_path.name + "::")]
    if not ids:
        raise RuntimeError(
            "no test collected from %s:\n%s" % (test_path.name, (out.stdout + out.stderr)[-3000:])
        )
    return ids


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("test_file", help="a file under Horovod's test/parallel, e.g. test_tensorflow.py")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--mode", choices=["file", "each"], default="file")
    p.add_argument("--timeout", type=float, default=300, help="seconds one test may take")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="extra rank environment")
    p.add_argument("--legacy-keras", action="store_true", help="TF_USE_LEGACY_KERAS=1 (needs tf_keras)")
    p.add_argument("-k", help="pytest -k expression (file mode)")
    p.add_argument("--json", help="also write the per-test outcomes to this file")
    p.add_argument("--src", help="Horovod checkout or git directory (default: HOROVOD_SRC, the mirror)")
    p.add_argument("--ref", default=REF)
    p.add_argument("--launcher", choices=LAUNCHERS, default="hvdliterun", help="how the ranks start")
    args = p.parse_args(argv)
    reason = available(args.src)
    if reason:
        print("horovod_suite: skipped: " + reason)
        return 0
    env = dict(kv.split("=", 1) for kv in args.env)
    if args.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    select = ["-k", args.k] if args.k else None
    result = run_suite(
        args.test_file,
        args.np,
        env,
        args.timeout,
        args.mode,
        select,
        args.src,
        args.ref,
        launcher=args.launcher,
    )
    print(result.summary())
    for nodeid, reason in result.named("skipped").items():
        print("  SKIPPED %s: %s" % (nodeid, reason))
    if not result.tests:
        print(result.log_tail)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({n: dataclasses.asdict(o) for n, o in result.tests.items()}, f, indent=1)
    counts = result.counts()
    return 1 if counts["failed"] or counts["hang"] or not result.tests else 0


if __name__ == "__main__":
    sys.exit(main())
