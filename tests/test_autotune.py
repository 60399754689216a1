"""Autotune and the cycle time: settings change how tensors are grouped, never the results."""

import csv

import numpy as np
from helpers import run_pooled


def _training_like(iterations):
    import hvdlite as hvd

    hvd.init()
    ok = True
    for step in range(iterations):
        handles = [
            hvd.allreduce_async(
                np.full(2000 + 100 * i, hvd.rank() + step, np.float32), op=hvd.Sum, name="grad.%d" % i
            )
            for i in range(8)
        ]
        want = 2 * step + 1
        ok &= all(bool((hvd.synchronize(h) == want).all()) for h in handles)
    hvd.shutdown()
    return ok


def test_autotune_tries_every_candidate_logs_and_chooses(tmp_path):
    log = str(tmp_path / "autotune.csv")
    env = {
        "HVDLITE_AUTOTUNE": "1",
        "HVDLITE_AUTOTUNE_LOG": log,
        "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": "0",
    }
    assert all(run_pooled(_training_like, 2, args=(150,), env=env, timeout=120))
    with open(log) as f:
        rows = list(csv.DictReader(f))
    tried = [r for r in rows if r["note"] == "tried"]
    chosen = [r for r in rows if r["note"] == "chosen"]
    assert len(tried) == 10 and len(chosen) == 1
    assert {int(r["fusion_threshold_bytes"]) for r in tried} >= {1 << 20, 128 << 20}
    assert {float(r["cycle_time_ms"]) for r in tried} >= {0.0, 5.0}
    assert all(float(r["score_bytes_per_second"]) > 0 for r in tried)
    best = max(tried, key=lambda r: float(r["score_bytes_per_second"]))
    assert chosen[0]["score_bytes_per_second"] == best["score_bytes_per_second"]


def test_cycle_time_holds_tensors_for_fusion_with_same_results():
    assert all(run_pooled(_training_like, 2, args=(20,), env={"HVDLITE_CYCLE_TIME": "2"}, timeout=60))
