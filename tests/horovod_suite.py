"""Runs one of Horovod 0.28.1's own test files, unchanged, against hvdlite on N ranks, as
Horovod's CI runs it (`horovodrun -np 2 pytest FILE`: the whole file in one pytest run per rank),
under Keras 3 and/or Keras 2 (TF_USE_LEGACY_KERAS=1), and prints per-test results.

    python tests/horovod_suite.py [--keras 3|2|both] [--np 2] [--test-timeout 120] \
        [--timeout 900] [--json OUT] [FILE ...]      # default FILE: test_tensorflow2_keras.py

FILE is a name under test/parallel/ at Horovod's v0.28.1 tag (HEAD where the tag is missing),
read from the mirror (--horovod-git, default /work/.mirror/horovod+horovod/repo or
$HOROVOD_GIT) into a temporary directory; nothing of Horovod is copied into this repository.
`import horovod` is hvdlite's compatibility namespace (compat/src, see docs/horovod_compat.md);
tests/horovod_standins provides `parameterized`, which Horovod's tests import.

Nothing hangs: every test gets --test-timeout seconds on each rank (SIGALRM fails it; a later
test then starts on every rank), and the whole run --timeout seconds (then its ranks are
stopped; tests without a junit entry on any rank are missing from the list). A test's outcome is the
worst over the ranks (failed > error > skipped > passed). Exit code 0 when the run finished.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "compat" / "examples"))
import run_offline  # noqa: E402  (compat/examples: runs a script under horovodrun with a time limit)

DEFAULT_GIT = os.environ.get("HOROVOD_GIT", "/work/.mirror/horovod+horovod/repo")
_RANK_ENTRY = "--rank-entry"
_WORST = ["passed", "skipped", "error", "failed"]


def extract(git_dir, name, dest):
    """Writes test/parallel/NAME at v0.28.1 (or HEAD) of the bare repository into dest/."""
    tags = subprocess.run(["git", "-C", git_dir, "tag"], capture_output=True, text=True, check=True).stdout
    ref = "v0.28.1" if "v0.28.1" in tags.split() else "HEAD"
    text = subprocess.run(
        ["git", "-C", git_dir, "show", "%s:test/parallel/%s" % (ref, name)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (dest / name).write_text(text)
    return ref


def run_file(path, np_, keras2, test_timeout, timeout, workdir):
    """One pytest run of `path` per rank under horovodrun (compat/examples/run_offline.py's
    run_one: --timeout bounds it); returns ({test id: (outcome, message)}, run_one's result)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env.update(
        TF_CPP_MIN_LOG_LEVEL="3",
        TF_USE_LEGACY_KERAS="1" if keras2 else "0",
        PYTHONPATH=os.pathsep.join([str(HERE / "horovod_standins"), str(REPO / "compat" / "src"), str(REPO)]),
    )
    args = [_RANK_ENTRY, str(test_timeout), str(workdir), str(path)]
    run = run_offline.run_one(Path(__file__), args, np_, env, workdir, timeout)
    return merge([workdir / ("junit.%d.xml" % r) for r in range(np_)]), run


def merge(xml_paths):
    """{test name: (worst outcome over ranks, first message)} from the ranks' junit reports
    (a rank stopped by --timeout has none)."""
    results = {}
    for path in xml_paths:
        if not path.exists():
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            name = "%s::%s" % (case.get("classname", "").rsplit(".", 1)[-1], case.get("name"))
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
                    message = (node.get("message") or "").strip().splitlines()[:1]
                    message = message[0][:200] if message else ""
            old = results.get(name)
            if old is None or _WORST.index(outcome) > _WORST.index(old[0]):
                results[name] = (outcome, message)
    return results


def rank_entry(test_timeout, workdir, path):
    """One rank: pytest over `path`, each test bounded by SIGALRM, junit report per rank."""
    import pytest

    class _Bound:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            def expire(signum, frame):
                raise TimeoutError("test exceeded %ss on this rank" % test_timeout)

            old = signal.signal(signal.SIGALRM, expire)
            signal.alarm(int(test_timeout))
            try:
                yield
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)

    rank = os.environ.get("HVDLITE_RANK", "0")
    args = ["-q", "-p", "no:cacheprovider", "--junitxml=%s/junit.%s.xml" % (workdir, rank), path]
    return pytest.main(args, plugins=[_Bound()])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", default=["test_tensorflow2_keras.py"])
    p.add_argument("--keras", choices=["3", "2", "both"], default="both")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--test-timeout", type=float, default=120.0, help="seconds per test and rank")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per file and Keras")
    p.add_argument("--horovod-git", default=DEFAULT_GIT)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hvdlite-horovod-suite-"))
    report = {}
    for name in args.files:
        ref = extract(args.horovod_git, name, root)
        for keras in ["3", "2"] if args.keras == "both" else [args.keras]:
            workdir = root / ("%s.keras%s" % (name, keras))
            workdir.mkdir()
            results, run = run_file(
                root / name, args.np, keras == "2", args.test_timeout, args.timeout, workdir
            )
            key = "%s@%s keras%s" % (name, ref, keras)
            report[key] = {"run": run, "tests": results}
            counts = {o: sum(1 for r in results.values() if r[0] == o) for o in _WORST}
            print("== %s: %s (%s; log %s)" % (key, counts, run["status"], run["log"]), flush=True)
            for test, (outcome, message) in sorted(results.items()):
                print("   %-8s %s%s" % (outcome, test, "  -- " + message if message else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _RANK_ENTRY:
        sys.exit(rank_entry(float(sys.argv[2]), sys.argv[3], sys.argv[4]))
    sys.exit(main())
