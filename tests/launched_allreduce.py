"""The script the launcher tests start under each launcher (torchrun, srun, ...): hvd.init() with
nothing launcher-specific, one allreduce, then one JSON line with what this rank saw.

CRASH_ON_FIRST_ATTEMPT=<rank>: that rank exits 3 before init() while TORCHELASTIC_RESTART_COUNT
is 0 (torchrun --max-restarts then starts the job again). LOOP_STEPS=<n>: n more allreduces, one
every LOOP_SLEEP seconds (default 0.1), before the JSON line; rank 0 writes "LOOPING size <size>"
to stderr as the loop starts. KILL_RANK=<rank>: that rank SIGKILLs itself after the first
allreduce."""

import json
import os
import sys
import time

import numpy as np

import hvdlite as hvd

T0 = time.monotonic()
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    crash = os.environ.get("CRASH_ON_FIRST_ATTEMPT", "")
    if crash != "" and os.environ.get("RANK") == crash:
        sys.exit(3)
hvd.init()
INIT_S = time.monotonic() - T0
out = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum, name="launched")
if os.environ.get("KILL_RANK") == str(hvd.rank()):
    os.kill(os.getpid(), 9)  # a task killed mid-job: the others must fail, naming it
if os.environ.get("LOOP_STEPS"):
    if hvd.rank() == 0:
        sys.stderr.write("LOOPING size %d\n" % hvd.size())
        sys.stderr.flush()
    for _ in range(int(os.environ["LOOP_STEPS"])):
        time.sleep(float(os.environ.get("LOOP_SLEEP", "0.1")))
        hvd.allreduce(np.array([1.0]), name="loop")
record = (
    json.dumps(
        {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "local": [hvd.local_rank(), hvd.local_size()],
            "cross": [hvd.cross_rank(), hvd.cross_size()],
            "sum": float(out[0]),
            "init_s": INIT_S,
            "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
            "host": os.uname().nodename,
        }
    )
    + "\n"
)
os.write(1, record.encode())  # one write: the ranks share the launcher's stdout
hvd.shutdown()
