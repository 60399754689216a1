"""Runtime life cycle, configuration and idleness."""

import os
import resource
import time

import numpy as np
import pytest
from helpers import run_pooled


def _reinit():
    import hvdlite as hvd

    out = []
    for i in range(3):
        hvd.init()
        out.append(hvd.allreduce(np.ones(2) * i, op=hvd.Sum, name="x").tolist())
        hvd.shutdown()
        assert not hvd.is_initialized()
    try:
        hvd.allreduce(np.ones(1))
    except hvd.PreconditionError as e:
        out.append(str(e))
    return out


def test_init_after_shutdown_starts_a_new_session():
    for out in run_pooled(_reinit, 2, timeout=60):
        assert out[:3] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]
        assert "not initialized" in out[3]


def test_single_process_without_launcher():
    import subprocess
    import sys

    code = (
        "import numpy as np, hvdlite as hvd; hvd.init(); "
        "print(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.allreduce(np.ones(3)).tolist()); hvd.shutdown()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "0", "[1.0,", "1.0,", "1.0]"]


def _idle_cpu(seconds):
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(1000), name="warm")
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    hvd.shutdown()
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_idle_rank_uses_well_under_one_percent_of_a_core():
    seconds = 3.0
    for cpu in run_pooled(_idle_cpu, 2, args=(seconds,), timeout=60):
        assert cpu < 0.01 * seconds, "idle rank used %.4f s of CPU in %.1f s" % (cpu, seconds)


def _init_error():
    import hvdlite as hvd

    try:
        hvd.init()
        return None
    except hvd.HvdliteError as e:
        return type(e).__name__, str(e)


def test_horovod_variable_is_honoured_as_fallback_and_bad_values_are_named():
    results = run_pooled(_init_error, 2, env={"HOROVOD_CYCLE_TIME": "fast"}, timeout=60)
    for kind, message in results:
        assert kind == "InvalidArgumentError"
        assert "HVDLITE_CYCLE_TIME" in message and "fast" in message


def test_missing_store_address_is_a_clear_error():
    env = {"HVDLITE_STORE_ADDR": None}
    for kind, message in run_pooled(_init_error, 2, env=env, timeout=60):
        assert kind == "InvalidArgumentError" and "HVDLITE_STORE_ADDR" in message and "hvdliterun" in message


def _fusion_many_small():
    import hvdlite as hvd

    hvd.init()
    handles = [
        hvd.allreduce_async(np.full(i + 1, hvd.rank() + 1.0), op=hvd.Sum, name="f%d" % i) for i in range(200)
    ]
    out = [hvd.synchronize(h) for h in handles]
    hvd.shutdown()
    return all(o.tolist() == [3.0] * (i + 1) for i, o in enumerate(out))


@pytest.mark.parametrize("threshold", ["0", "256", str(64 * 1024 * 1024)])
def test_fusion_threshold_settings_give_identical_results(threshold):
    assert all(run_pooled(_fusion_many_small, 2, env={"HVDLITE_FUSION_THRESHOLD": threshold}, timeout=60))


def test_settings_table_declares_each_variable_once_with_doc():
    from hvdlite.common import settings

    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    assert all(s.doc and s.type in ("int", "float", "bool", "str") for s in settings.SETTINGS)
    assert settings.get("FUSION_THRESHOLD", {"HOROVOD_FUSION_THRESHOLD": "5"}) == 5
    assert (
        settings.get("FUSION_THRESHOLD", {"HOROVOD_FUSION_THRESHOLD": "5", "HVDLITE_FUSION_THRESHOLD": "7"})
        == 7
    )
    assert "HVD_SETTING(FUSION_THRESHOLD, int64_t" in settings.cpp_header()


def _uneven_batches():
    import hvdlite as hvd

    hvd.init()
    r = hvd.rank()
    batches = 2 + 2 * r  # rank 0 runs out of data first
    sums, gathered = [], []
    for step in range(batches):
        sums.append(hvd.allreduce(np.full(3, r + 1.0), op=hvd.Sum, name="grad").tolist())
        if step < 2:  # every rank still has data (allgather cannot run once one has joined)
            gathered.append(hvd.allgather(np.full((1, 2), r), name="rows").shape[0])
    maxes = None
    if r == 2:  # ranks 0 and 1 have joined: they contribute identities
        maxes = hvd.allreduce(np.full(2, -5.0), op=hvd.Max, name="max").tolist()
        maxes += hvd.allreduce(np.full(1, 7, np.int32), op=hvd.Min, name="min").tolist()
        hvd.barrier()
        # Horovod: only allreduce runs with joined ranks; the data collectives fail
        for kind, call in (
            ("a2a", lambda: hvd.alltoall(np.ones((3, 1)), name="a2a-while-joined")),
            ("allgather", lambda: hvd.allgather(np.ones((1, 2)), name="ag-while-joined")),
            ("broadcast", lambda: hvd.broadcast(np.ones(2), root_rank=2, name="bc-while-joined")),
        ):
            try:
                call()
                maxes.append(kind + " ran")
            except hvd.NotSupportedError as e:
                maxes.append("joined" in str(e) and "ranks 0, 1" in str(e) and isinstance(e, RuntimeError))
    last = hvd.join()
    try:
        hvd.alltoall(np.ones((3, 1)), name="a2a-after-join")
        after = "ok"
    except hvd.HvdliteError as e:
        after = type(e).__name__
    hvd.shutdown()
    return sums, gathered, maxes, last, after


def test_join_lets_ranks_with_fewer_batches_finish():
    results = run_pooled(_uneven_batches, 3, timeout=60)
    for r, (sums, gathered, maxes, last, after) in enumerate(results):
        assert last == 2
        assert after == "ok"
        # steps 0-1: all 3 ranks; steps 2-3: ranks 1 and 2; steps 4-5: rank 2 alone
        want = [6.0, 6.0, 5.0, 5.0, 3.0, 3.0][: len(sums)]
        assert [s[0] for s in sums] == want
        assert gathered == [3, 3]
        if r == 2:
            assert maxes == [-5.0, -5.0, 7, True, True, True]


def _scalar_split_ops_straight_to_the_core():
    """The adapters refuse 0-d reducescatter/alltoall; a direct caller of the core must get an
    InvalidArgumentError too, never a crash of the process."""
    import hvdlite as hvd
    from hvdlite.common import dtypes, exceptions, ops

    hvd.init()
    errors = []
    for op_type, op_name in ((4, "reducescatter"), (3, "alltoall")):
        scalar = np.ones((), np.float32)
        try:
            ops.submit(op_type, "scalar." + op_name, scalar, dtypes.FLOAT32, ())
            errors.append(None)
        except exceptions.InvalidArgumentError as e:
            errors.append(str(e))
    hvd.shutdown()
    return errors


def test_zero_dim_reducescatter_and_alltoall_are_refused_by_the_core():
    for errors in run_pooled(_scalar_split_ops_straight_to_the_core, 2, timeout=60):
        assert "reducescatter of tensor 'scalar.reducescatter' needs at least one dimension" in errors[0]
        assert "alltoall of tensor 'scalar.alltoall' needs at least one dimension" in errors[1]
