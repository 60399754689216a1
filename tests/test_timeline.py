"""The Chrome-trace timeline: HVDLITE_TIMELINE, hvdliterun --timeline-filename,
and start_timeline()/stop_timeline() at run time."""

import json
import os
import subprocess
import sys

import numpy as np
from helpers import run_pooled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _events(path):
    with open(path) as f:
        events = json.load(f)
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [(rows.get(e["tid"]), e["name"], e.get("args", {})) for e in events if e.get("ph") == "X"]
    marks = [(rows.get(e["tid"]), e["name"], e.get("args", {})) for e in events if e.get("ph") == "i"]
    return rows, spans, marks


def _workload():
    import hvdlite as hvd

    hvd.init()
    handles = [hvd.allreduce_async(np.ones(1000, np.float32), name="grad.%d" % i) for i in range(8)]
    for h in handles:
        hvd.synchronize(h)
    hvd.allgather(np.ones((hvd.rank() + 1, 2)), name="rows")
    hvd.broadcast(np.ones(3), root_rank=1, name="weights")
    hvd.shutdown()


def test_timeline_from_environment_records_each_phase(tmp_path):
    path = str(tmp_path / "timeline.json")
    run_pooled(_workload, 2, env={"HVDLITE_TIMELINE": path}, timeout=60)
    rows, spans, marks = _events(path)
    assert {"grad.0", "grad.7", "rows", "weights"} <= set(rows.values())
    names = {(tensor, phase) for tensor, phase, _ in spans}
    for tensor in ("grad.0", "rows", "weights"):
        assert (tensor, "QUEUE") in names
    assert ("grad.3", "NEGOTIATE_ALLREDUCE") in names and ("rows", "NEGOTIATE_ALLGATHER") in names
    collective = [args for tensor, phase, args in spans if phase == "ALLREDUCE"]
    assert collective and all(a["algorithm"].startswith("ring/") and a["bytes"] > 0 for a in collective)
    assert any(a["tensors"] > 1 for a in collective), "8 async allreduces should fuse at least once"
    # Which tensors share a response depends on timing; a fused response of these small ones
    # always goes through the fusion buffer.
    assert any(phase == "MEMCPY_IN_FUSION_BUFFER" for _, phase in names)
    assert any(phase == "BROADCAST" and a["algorithm"] == "ring/binomial_tree" for _, phase, a in spans)
    ready_ranks = {a["rank"] for tensor, what, a in marks if tensor == "rows" and what == "READY"}
    assert ready_ranks == {0, 1}


def _start_stop(first, second):
    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(2), name="before")
    hvd.start_timeline(first)
    hvd.allreduce(np.ones(2), name="during")
    hvd.start_timeline(second, mark_cycles=True)  # switches files
    hvd.allreduce(np.ones(2), name="switched")
    hvd.stop_timeline()
    hvd.allreduce(np.ones(2), name="after")
    hvd.shutdown()


def test_start_and_stop_timeline_at_run_time(tmp_path):
    first, second = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    run_pooled(_start_stop, 2, args=(first, second), timeout=60)
    rows_a, _, _ = _events(first)
    rows_b, spans_b, marks_b = _events(second)
    assert "during" in rows_a.values() and "before" not in rows_a.values()
    assert "switched" in rows_b.values()
    # rank 1 may already have asked for 'after' while rank 0's timeline was on,
    # but rank 0 ran it only after stop_timeline()
    assert not any(tensor == "after" and phase == "ALLREDUCE" for tensor, phase, _ in spans_b)
    assert any(what == "CYCLE_START" for _, what, _ in marks_b)


def test_hvdliterun_timeline_filename(tmp_path):
    path = str(tmp_path / "run.json")
    script = (
        "import numpy as np, hvdlite as hvd; hvd.init(); hvd.allreduce(np.ones(4), name='x'); hvd.shutdown()"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvdlite.runner.launch",
            "-np",
            "2",
            "--timeline-filename",
            path,
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    rows, spans, _ = _events(path)
    assert "x" in rows.values() and any(phase == "ALLREDUCE" for _, phase, _ in spans)


def _steady_loop():
    import hvdlite as hvd

    hvd.init()
    for _ in range(30):
        hvd.allreduce(np.ones(256, np.float32), name="small")
    hvd.shutdown()


def test_timeline_marks_allreduces_reduced_from_voted_inputs(tmp_path):
    # Once the loop runs from the steady-state schedule, its small allreduce reduces the inputs
    # the ranks' votes carried; the timeline says so on the collective's span.
    path = str(tmp_path / "timeline.json")
    run_pooled(_steady_loop, 2, env={"HVDLITE_TIMELINE": path}, timeout=60)
    _, spans, _ = _events(path)
    collective = [args for tensor, phase, args in spans if tensor == "small" and phase == "ALLREDUCE"]
    assert len(collective) == 30, len(collective)
    voted = [a for a in collective if a.get("voted_inputs")]
    assert 0 < len(voted) < 30, collective  # the first ones were negotiated
    assert all(a["algorithm"] == "ring/recursive_doubling" for a in voted), voted


def _read_while_running(path):
    import time

    import hvdlite as hvd

    hvd.init()
    hvd.allreduce(np.ones(3), name="early")
    hvd.barrier()
    text = ""
    deadline = time.monotonic() + 10.0  # the engine flushes as it goes idle; bounded wait only
    while hvd.rank() == 0 and '"ALLREDUCE"' not in text and time.monotonic() < deadline:
        time.sleep(0.01)
        with open(path) as f:
            text = f.read()
    hvd.barrier()
    hvd.shutdown()
    return text


def test_timeline_is_on_disk_while_the_job_runs(tmp_path):
    """Horovod's test_timeline.py reads the file 0.1 s after an allreduce, before shutdown."""
    path = str(tmp_path / "live.json")
    text = run_pooled(_read_while_running, 2, args=(path,), env={"HVDLITE_TIMELINE": path}, timeout=60)[0]
    assert '"early"' in text and '"ALLREDUCE"' in text and '"NEGOTIATE_ALLREDUCE"' in text
