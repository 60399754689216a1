"""Runs the selected cases of one parametrized test function at the same time, for cases that
mostly wait (whole jobs waiting out discovery intervals, sleeps and timeouts) rather than compute.

    @pytest.fixture(scope="module")
    def scenario_runs(request):
        with ConcurrentCases(request, "test_scenario", run_scenario, workers=3) as cases:
            yield cases

    @pytest.mark.parametrize("name", NAMES)
    def test_scenario(name, scenario_runs):
        result = scenario_runs.result(name=name)   # run_scenario(name=name)'s value, or its raise
        assert ...                                 # judged here, in the test, as before

Contract:
  - On entry, every item of the session that pytest will run (after -k / -m / deselection) and
    that is `test_name` of the requesting module is submitted, in the session's order, to a
    pool of `workers` threads: run(**params) with that item's parametrize arguments (only the
    names `run` accepts).
  - result(**params) waits for that case and returns its value or raises what it raised, in the
    calling test: a skip raised inside run skips that test with run's reason, an AssertionError
    fails it.
  - On exit the cases not yet started are cancelled and the running ones are waited for: every
    bound on a case (its subprocess timeouts) is run's own.
"""

import concurrent.futures
import inspect
import time


class ConcurrentCases:
    def __init__(self, request, test_name, run, workers):
        self._run = run
        self._accepts = set(inspect.signature(run).parameters)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=test_name)
        self._futures = {}  # case key -> future of (run's value, seconds it ran)
        for item in request.session.items:
            if getattr(item, "module", None) is not request.module:
                continue
            if getattr(item, "originalname", item.name) != test_name:
                continue
            key = self._key(item.callspec.params)
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._timed, key)

    def _key(self, params):
        return tuple(sorted((k, v) for k, v in params.items() if k in self._accepts))

    def __len__(self):
        return len(self._futures)

    def result(self, **params):
        key = self._key(params)
        if key not in self._futures:  # e.g. the test was not in the session's items at the start
            self._futures[key] = self._pool.submit(self._timed, key)
        value, seconds = self._futures[key].result()
        print("case %s ran %.1f s" % (dict(key), seconds))
        return value

    def _timed(self, key):
        """run's value for the case and the seconds it ran (a raise propagates untimed)."""
        started = time.monotonic()
        value = self._run(**dict(key))
        return value, time.monotonic() - started

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._pool.shutdown(wait=True, cancel_futures=True)
        return False
