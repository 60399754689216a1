"""How busy the machine is, and a library-free gate that holds ranks until it is idle.

Used inside benchmark ranks (any library, any venv: only the standard library here).

    gate = Gate(os.environ["BENCH_GATE_DIR"], rank, size)   # every rank, once, at start-up
    idle = gate.wait_idle()       # every rank; rank 0 waits for an idle machine, the others sleep
    meter = gate.meter()          # rank 0 only: LoadMeter over all ranks of this job
    meter.start(); ...timed work...; load = meter.stop()

Contracts:
  - CPU "used by others" over a window = machine busy time from /proc/stat minus the CPU time
    (user + system, all threads) of this job's rank processes, read from /proc/<pid>/stat. It
    includes launchers (mpirun, hvdliterun, horovodrun) and the benchmark driver, which sleep.
  - Reported as a fraction of the whole machine (all cores): 0.10 = 10% of ncpu x wall.
  - While rank 0 waits for an idle machine the other ranks sleep-poll a file (a few wake-ups per
    10 ms), so a rank whose library spins in barrier() does not make the machine look busy.
"""

import os
import time

BUSY_LIMIT = 0.10  # others' share of the machine above which a measurement is flagged
_TICK = os.sysconf("SC_CLK_TCK")
_NCPU = os.cpu_count() or 1
_POLL_S = 0.002  # non-zero ranks' sleep between looks at the go file
_SAMPLE_S = 0.3  # idle check window


def _machine_times():
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is inside user
    return (total - idle) / _TICK, total / _TICK


def _process_cpu(pid):
    """User + system CPU seconds of process `pid` (all its threads); 0 when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / _TICK  # utime, stime (fields 14, 15)


class LoadMeter:
    """Measures the CPU others used while this job's ranks (`pids`) ran a window."""

    def __init__(self, pids):
        self.pids = list(pids)
        self._start = None

    def _read(self):
        busy, _ = _machine_times()
        return time.monotonic(), busy, sum(_process_cpu(p) for p in self.pids)

    def start(self):
        self._start = self._read()

    def stop(self):
        """Returns {'wall_s', 'ranks_cpu_s', 'others_cpu_s', 'others'} for the window since
        start(); 'others' is the share of the whole machine (0..1)."""
        t1, busy1, ranks1 = self._read()
        t0, busy0, ranks0 = self._start
        wall = max(t1 - t0, 1e-9)
        others = max(0.0, (busy1 - busy0) - (ranks1 - ranks0))
        return {
            "wall_s": wall,
            "ranks_cpu_s": ranks1 - ranks0,
            "others_cpu_s": others,
            "others": min(1.0, others / (wall * _NCPU)),
        }


class Gate:
    """File-based rendezvous of one job's ranks in directory `path` (the driver makes it
    empty and unique per job). Every rank constructs it once, at start-up."""

    def __init__(self, path, rank, size):
        self.path, self.rank, self.size = path, rank, size
        self._seq = 0
        self._write("pid.%d" % rank, str(os.getpid()))

    def _write(self, name, text):
        tmp = os.path.join(self.path, ".%s.%d.tmp" % (name, os.getpid()))
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(self.path, name))

    def _read(self, name):
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read()
        except OSError:
            return None

    def pids(self, timeout_s=60.0):
        """PIDs of all ranks (waits until every rank has written its own)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [self._read("pid.%d" % r) for r in range(self.size)]
            if all(found):
                return [int(p) for p in found]
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "ranks %s never wrote their pid to %s"
                    % ([r for r, p in enumerate(found) if not p], self.path)
                )
            time.sleep(0.01)

    def meter(self):
        return LoadMeter(self.pids())

    def wait_idle(self, max_wait_s):
        """All ranks call it together. Rank 0 samples the machine until others use at most
        BUSY_LIMIT of it over one window, or max_wait_s passes; then every rank returns.
        Returns (seconds waited, others' share in the last window, None when max_wait_s <= 0:
        no sampling at all) on rank 0, None elsewhere."""
        self._seq += 1
        if self.rank != 0:
            while int(self._read("go") or 0) < self._seq:
                time.sleep(_POLL_S)
            return None
        meter, t0, others, waited = self.meter(), time.monotonic(), None, 0.0
        while max_wait_s > 0:
            meter.start()
            time.sleep(_SAMPLE_S)
            others = meter.stop()["others"]
            waited = time.monotonic() - t0
            if others <= BUSY_LIMIT or waited >= max_wait_s:
                break
        self._write("go", str(self._seq))
        return waited, others


def timed_steps(comm, gate, step, steps, idle_wait, warmup=3):
    """Runs step() `warmup` times, waits (at most idle_wait s) for an idle machine, then `steps`
    timed calls, each after comm.barrier() (outside the timed region). Returns (seconds per
    step, rank 0's LoadMeter result or None). Shared by the end-to-end workers of every framework."""
    for _ in range(warmup):
        comm.barrier()
        step()
    gate.wait_idle(idle_wait)
    meter = gate.meter() if comm.rank == 0 else None
    comm.barrier()
    if meter:
        meter.start()
    times = []
    for _ in range(steps):
        comm.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times, (meter.stop() if meter else None)
