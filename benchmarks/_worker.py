"""What every benchmark rank shares: its command line, joining the job, the idle gate and
its result document. The driver side of the same contract is _launch.run_job.

    args = parse_args(add=lambda p: p.add_argument("--steps", type=int, required=True))
    comm, gate = join(args)             # the job its launcher started (_comms), and _machine.Gate
    ...timed work (e.g. _machine.timed_steps(comm, gate, step, args.steps, args.idle_wait))...
    finish(comm, args, step_doc(comm, times, load, params=n))   # DIR/rank<r>.json, barrier, close

Every rank takes --lib LIB (which library forms the job, see _comms.make_comm), --out DIR (the
driver's directory: results go to DIR/rank<r>.json, the gate lives in DIR/gate) and
--idle-wait S (how long rank 0 may wait for an idle machine before timing). Standard library
only (and _comms, which imports each library lazily), so it runs in Horovod's venv too.
"""

import argparse
import json
import os

from _comms import make_comm
from _machine import Gate


def parse_args(add=None, argv=None):
    """The rank's arguments: the shared three plus what `add(parser)` declares."""
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--idle-wait", type=float, required=True)
    if add is not None:
        add(p)
    return p.parse_args(argv)


def add_step_args(p):
    """The arguments of the step-timing workers (end-to-end and ZeRO): --mode (what the rank
    trains with), --model, --steps (timed steps) and --tiny (a small model: a smoke run)."""
    p.add_argument("--mode", required=True)
    p.add_argument("--model", default="mlp")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--tiny", action="store_true")


def join(args):
    """(comm, gate): joins the job and the idle gate; every rank calls it once, at start-up."""
    comm = make_comm(args.lib)
    return comm, Gate(os.path.join(args.out, "gate"), comm.rank, comm.size)


def save_json(path, doc):
    """Writes `doc` atomically (a rank that dies leaves the previous version whole)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def rank_path(comm, args):
    return os.path.join(args.out, "rank%d.json" % comm.rank)


def step_doc(comm, times, load, **extra):
    """A step-timing rank's document: {"rank", "size", "version", "times", ...extra}, with
    "load" (rank 0's LoadMeter result) where given."""
    doc = dict({"rank": comm.rank, "size": comm.size, "version": comm.version, "times": times}, **extra)
    if load:
        doc["load"] = load
    return doc


def run(measure, add=add_step_args, setup=None):
    """A whole rank: parse_args(add), setup() (e.g. one compute thread), join, then
    finish(comm, args, measure(comm, gate, args))."""
    args = parse_args(add)
    if setup is not None:
        setup()
    comm, gate = join(args)
    finish(comm, args, measure(comm, gate, args))


def finish(comm, args, doc=None):
    """Writes `doc` (when given) as this rank's result, then waits for every rank and leaves
    the job."""
    if doc is not None:
        save_json(rank_path(comm, args), doc)
    comm.barrier()
    comm.close()
