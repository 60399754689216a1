"""Tests of tests/concurrent_cases.py: the selected cases run at the same time, each test gets
its own case's value, and a case's skip or failure reaches its test alone."""

import threading

import pytest
from concurrent_cases import ConcurrentCases

_MEETING = {}  # the barrier every selected "meet" case waits at: they pass it only together


def _case(kind, n):
    if kind == "meet":
        _MEETING["barrier"].wait(timeout=120)  # BrokenBarrierError unless all run at once
        return n * 10
    if kind == "skip":
        pytest.skip("case %d skips itself" % n)
    raise AssertionError("case %d fails" % n)


@pytest.fixture(scope="module")
def cases(request):
    meets = [
        item
        for item in request.session.items
        if item.module is request.module and item.callspec.params.get("kind") == "meet"
    ]
    _MEETING["barrier"] = threading.Barrier(len(meets))
    with ConcurrentCases(request, "test_each_case_reaches_its_test", _case, workers=len(meets) or 1) as out:
        yield out


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", ["meet", "skip", "fail"])
def test_each_case_reaches_its_test(kind, n, cases):
    if kind == "meet":
        assert cases.result(kind=kind, n=n) == n * 10
    elif kind == "skip":
        with pytest.raises(pytest.skip.Exception, match="case %d skips itself" % n):
            cases.result(kind=kind, n=n)
    else:
        with pytest.raises(AssertionError, match="case %d fails" % n):
            cases.result(kind=kind, n=n)
