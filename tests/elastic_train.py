"""An elastic NumPy training loop run by tests/test_elastic*.py under `hvdliterun --min-np ...`.

Every committed step appends (step, size) to state.log, so the test can check that no step was
lost or done twice and recompute the final weights. Each step's update is the average over the
ranks of grad(step, rank) = (step + 1) * 0.01 + rank, which depends on the world size.

Environment knobs (all optional):
  ELASTIC_STEPS      number of steps (default 40)
  ELASTIC_SLEEP      seconds per step (default 0.05)
  ELASTIC_KILL       "worker_id:step[,worker_id:step...]": that worker SIGKILLs itself in that step,
                     after its gradient's allreduce was submitted (mid-step), before the commit
  ELASTIC_RAISE      same, but the worker raises ValueError
  ELASTIC_FREEZE     same, but the worker stops itself (SIGSTOP: its sockets stay open)
  ELASTIC_PID_DIR    a folder: each worker creates an empty file named after its pid there
  ELASTIC_START_DELAY "worker_id:seconds": that worker sleeps before hvd.init() (a slow start)
  ELASTIC_STALL      "worker_id:step": that worker sleeps ELASTIC_STALL_S (default 4) s before
                     submitting that step's allreduce, once per process (a stall, no exit);
                     with ELASTIC_STALL_SPIN=1 it spins in pure Python instead (holding the GIL)
Output: "PID <pid>" first, "STEP <step> <size> <rank> <time>" after each commit, "KILL <time>" before a kill, "FREEZE <time>" before a SIGSTOP,
"DONE <json log> <json w>" at the end on rank 0.
"""

import json
import os
import signal
import time

import numpy as np

import hvdlite as hvd

STEPS = int(os.environ.get("ELASTIC_STEPS", "40"))
SLEEP = float(os.environ.get("ELASTIC_SLEEP", "0.05"))
ME = os.environ.get("HVDLITE_ELASTIC_WORKER_ID", "")


def _plan(var):
    out = {}
    for item in filter(None, os.environ.get(var, "").split(",")):
        wid, _, step = item.rpartition(":")
        out[wid] = float(step)
    return out


KILL, RAISE, STALL = _plan("ELASTIC_KILL"), _plan("ELASTIC_RAISE"), _plan("ELASTIC_STALL")
FREEZE = _plan("ELASTIC_FREEZE")
stalled = []
time.sleep(_plan("ELASTIC_START_DELAY").get(ME, 0.0))
print("PID %d" % os.getpid(), flush=True)
if os.environ.get("ELASTIC_PID_DIR"):
    open(os.path.join(os.environ["ELASTIC_PID_DIR"], str(os.getpid())), "w").close()


def grad(step, rank):
    return np.full(4, (step + 1) * 0.01 + rank)


hvd.init()
state = hvd.elastic.ObjectState(step=0, w=np.zeros(4), log=[], resets=0)
state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        if STALL.get(ME) == state.step and not stalled:
            stalled.append(state.step)
            seconds = float(os.environ.get("ELASTIC_STALL_S", "4"))
            if os.environ.get("ELASTIC_STALL_SPIN") == "1":
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    pass
            else:
                time.sleep(seconds)
        handle = hvd.allreduce_async(grad(state.step, hvd.rank()), op=hvd.Average, name="grad")
        if KILL.get(ME) == state.step:
            print("KILL %.6f" % time.time(), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if FREEZE.get(ME) == state.step:
            print("FREEZE %.6f" % time.time(), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if RAISE.get(ME) == state.step:
            raise ValueError("worker %s fails on purpose at step %d" % (ME, state.step))
        state.w = state.w - 0.1 * hvd.synchronize(handle)
        state.log.append((state.step, hvd.size()))
        state.step += 1
        time.sleep(SLEEP)
        state.commit()
        print("STEP %d %d %d %.6f" % (state.step - 1, hvd.size(), hvd.rank(), time.time()), flush=True)
    return state.w


w = train(state)
if hvd.rank() == 0:
    print("DONE %s %s" % (json.dumps(state.log), json.dumps(w.tolist())), flush=True)
hvd.shutdown()
