"""The response cache as a bounded LRU, end to end: with a capacity far below the
number of names a loop uses, names are admitted, evicted and re-admitted every step
(and unnamed one-off ops pass through), and every rank still agrees on what each
cache id means: results stay right and nothing hangs."""

import numpy as np
import pytest
from helpers import run_pooled


def _churn(steps):
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    r = hvd.rank()
    out = []
    for step in range(steps):
        # Phases of 4 steps alternate between two sets of 3 names: with capacity 3 each
        # phase evicts the other's names. Asynchronous, so several names are in flight
        # while others get evicted.
        prefix = "ab"[step // 4 % 2]
        handles = [
            hvd.allreduce_async(np.full(3, float(r + i + step)), op=hvd.Sum, name="%s%d" % (prefix, i))
            for i in range(3)
        ]
        metric = hvd.allreduce(np.array([float(r)]), op=hvd.Sum)  # unnamed: a one-off name
        out.append(([hvd.synchronize(h).tolist() for h in handles], metric.tolist()))
    stats = runtime_stats()
    hvd.shutdown()
    return out, stats


@pytest.mark.parametrize("capacity", ["0", "3", "1024"])
def test_names_survive_eviction(capacity):
    size, steps = 3, 16
    runs = run_pooled(_churn, size, args=(steps,), env={"HVDLITE_CACHE_CAPACITY": capacity}, timeout=120)
    results = [out for out, _ in runs]
    stats = runs[0][1]  # rank 0 hosts the coordinator and its cache
    assert stats["cache_entries"] <= int(capacity), stats
    if capacity == "3":
        assert stats["cache_evictions"] > 0, stats  # the phases evicted each other
    else:
        assert stats["cache_evictions"] == 0, stats
    if capacity == "1024":
        assert stats["cache_entries"] == 6, stats  # a0-a2, b0-b2; no one-off metric name
    for step in range(steps):
        tensors, metric = results[0][step]
        for i in range(3):
            assert tensors[i] == [float(sum(r + i + step for r in range(size)))] * 3, (step, i)
        assert metric == [float(sum(range(size)))]
    assert all(res == results[0] for res in results)
