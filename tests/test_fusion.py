"""Fused allreduce responses that mix large tensors (reduced in place, one collective
each) with small ones (packed into the fusion buffer): results, scales and averaging must
be the same as unfused, on every rank. The runtime's counters prove that fusion happened
(and did not under a zero threshold), so these tests fail when fusion is switched off."""

import numpy as np
import pytest
from helpers import run_pooled

SIZES = [10, 40000, 3, 1, 100000, 7, 0, 33000]  # float64: 40000 elements = 320 KB (direct)


def _mixed(op_name):
    import hvdlite as hvd
    from hvdlite.common.basics import runtime_stats

    hvd.init()
    r = hvd.rank()
    op = getattr(hvd, op_name)
    arrays = [np.arange(n, dtype=np.float64) % 17 + r for n in SIZES]
    handles = [
        hvd.allreduce_async(a, op=op, name="mix%d" % i, prescale_factor=2.0, postscale_factor=0.5)
        for i, a in enumerate(arrays)
    ]
    out = [hvd.synchronize(h).tobytes() for h in handles]
    stats = runtime_stats()
    hvd.shutdown()
    return out, stats


@pytest.mark.parametrize("threshold", ["0", str(64 * 1024 * 1024)])
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_fused_mix_of_large_and_small_tensors(threshold, op_name):
    size = 3
    # The cycle time holds decided tensors briefly so that all eight, submitted at
    # once, are planned together (fusion packs only what is decided in one cycle).
    env = {"HVDLITE_FUSION_THRESHOLD": threshold, "HVDLITE_CYCLE_TIME": "100"}
    runs = run_pooled(_mixed, size, args=(op_name,), env=env, timeout=120)
    results = [out for out, _ in runs]
    stats = [s for _, s in runs]
    for s in stats:
        assert s["allreduce_tensors"] == len(SIZES), s
        if threshold == "0":
            assert s["fused_responses"] == 0 and s["allreduce_responses"] == len(SIZES), s
        else:
            assert s["fused_responses"] >= 1 and s["allreduce_responses"] < len(SIZES), s
    for i, n in enumerate(SIZES):
        base = np.arange(n, dtype=np.float64) % 17
        want = sum(2.0 * (base + r) for r in range(size)) * 0.5
        if op_name == "Average":
            want = want / size
        for res in results:
            assert res[i] == results[0][i], "ranks disagree on tensor %d" % i
        assert np.frombuffer(results[0][i], np.float64).tolist() == want.tolist(), i
