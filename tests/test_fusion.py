"""Fused allreduce responses that mix large tensors (reduced in place, one collective
each) with small ones (packed into the fusion buffer): results, scales and averaging must
be the same as unfused, on every rank."""

import numpy as np
import pytest
from helpers import run_ranks

SIZES = [10, 40000, 3, 1, 100000, 7, 0, 33000]  # float64: 40000 elements = 320 KB (direct)


def _mixed(op_name):
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    op = getattr(hvd, op_name)
    arrays = [np.arange(n, dtype=np.float64) % 17 + r for n in SIZES]
    handles = [
        hvd.allreduce_async(a, op=op, name="mix%d" % i, prescale_factor=2.0, postscale_factor=0.5)
        for i, a in enumerate(arrays)
    ]
    out = [hvd.synchronize(h).tobytes() for h in handles]
    hvd.shutdown()
    return out


@pytest.mark.parametrize("threshold", ["0", str(64 * 1024 * 1024)])
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_fused_mix_of_large_and_small_tensors(threshold, op_name):
    size = 3
    results = run_ranks(
        _mixed, size, args=(op_name,), env={"HVDLITE_FUSION_THRESHOLD": threshold}, timeout=120
    )
    for i, n in enumerate(SIZES):
        base = np.arange(n, dtype=np.float64) % 17
        want = sum(2.0 * (base + r) for r in range(size)) * 0.5
        if op_name == "Average":
            want = want / size
        for res in results:
            assert res[i] == results[0][i], "ranks disagree on tensor %d" % i
        assert np.frombuffer(results[0][i], np.float64).tolist() == want.tolist(), i
