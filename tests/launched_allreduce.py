"""The script the launcher tests start under each launcher (torchrun, srun, ...): hvd.init() with
nothing launcher-specific, one allreduce, then one JSON line with what this rank saw.

CRASH_ON_FIRST_ATTEMPT=<rank>: that rank exits 3 before init() while TORCHELASTIC_RESTART_COUNT
is 0 (torchrun --max-restarts then starts the job again)."""

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
