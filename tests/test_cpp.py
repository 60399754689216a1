"""Runs the C++ unit tests (tests/cpp/test_*.cc): the transport and store over
real loopback sockets and the algorithms over the real transport, with ranks as
threads, and the coordinator's planning and response cache as pure logic on a
fake clock. They build in the CMake tree build/
that `make install` creates."""

import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
PROGRAMS = sorted(
    os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "tests/cpp/test_*.cc"))
)


# Programs whose cases split by rank count: the default suite runs them without the 3- and
# 4-rank worlds, and the slow set runs those (test_algorithms' command line selects cases).
SPLIT = {"test_algorithms": (["-/world3", "-/world4"], [["/world3"], ["/world4"]])}
CASES = []
for _program in PROGRAMS:
    _default, _slow = SPLIT.get(_program, ([], []))
    CASES.append(pytest.param(_program, _default, id=_program))
    CASES += [
        pytest.param(_program, args, id="%s%s" % (_program, "".join(args)), marks=pytest.mark.slow)
        for args in _slow
    ]


@pytest.mark.parametrize(("program", "args"), CASES)
def test_cpp_program(program, args):
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        pytest.skip("the CMake build tree build/ is missing: run `make install` first")
    build = subprocess.run(
        ["cmake", "--build", BUILD, "--target", program, "-j", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    run = subprocess.run([os.path.join(BUILD, program), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed, 0 failed" in run.stdout
