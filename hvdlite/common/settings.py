"""The one table of HVDLITE_* settings.

Every setting is declared here once: name (without the HVDLITE_ prefix), type,
default and one line of doc. The C++ core reads them once, in
``Config::FromEnv()``, through a header generated from this table at build time
(``python hvdlite/common/settings.py --cpp-header OUT``). For each setting the
matching ``HOROVOD_*`` variable is honoured when the ``HVDLITE_*`` one is unset.

This module imports nothing outside the standard library: the build runs it.
"""

import os
import sys
from collections import namedtuple

Setting = namedtuple("Setting", "name type default doc")

# type is one of: int, float, bool, str.  Keep sorted by topic, not alphabetically.
SETTINGS = (
    # Identity of this process in the job (set by hvdliterun or any other launcher).
    Setting("RANK", "int", -1, "rank of this process in the job; unset means a 1-process job"),
    Setting("SIZE", "int", -1, "number of processes in the job"),
    Setting("LOCAL_RANK", "int", -1, "rank among the processes on this host; computed when unset"),
    Setting("LOCAL_SIZE", "int", -1, "number of processes on this host; computed when unset"),
    Setting("CROSS_RANK", "int", -1, "rank among the processes with this local rank; computed when unset"),
    Setting("CROSS_SIZE", "int", -1, "number of processes with this local rank; computed when unset"),
    Setting(
        "HOSTNAME",
        "str",
        "",
        "identity of this host: ranks with equal ones share memory; default: gethostname(), boot id"
        " and /dev/shm's device",
    ),
    Setting(
        "NETWORK_INTERFACES",
        "str",
        "",
        "comma-separated interfaces; a rank listens on the first one's IPv4 address; default: the"
        " interface that routes to the store (hvdliterun --network-interfaces sets it)",
    ),
    # Rendezvous.
    Setting("STORE_ADDR", "str", "", "host:port of the rendezvous store (hvdliterun sets it)"),
    Setting("SECRET", "str", "", "per-job secret (hex) proving membership to the store and to peers"),
    Setting(
        "SECRET_FILE",
        "str",
        "",
        "file holding the job secret (hex), e.g. on a shared filesystem: read by hvd.init() when"
        " HVDLITE_SECRET is unset under a launcher that hands out none (torchrun, srun;"
        " docs/launchers.md)",
    ),
    Setting("START_TIMEOUT", "float", 60.0, "seconds init() waits for every rank to reach the rendezvous"),
    # Elastic training (hvdliterun --min-np/--max-np/--host-discovery-script sets these).
    Setting(
        "ELASTIC_STORE_ADDR",
        "str",
        "",
        "host:port of the elastic driver's store, where each generation of the job is published;"
        " set means this process is an elastic worker",
    ),
    Setting("ELASTIC_SECRET", "str", "", "secret (hex) proving membership to the elastic driver's store"),
    Setting("ELASTIC_WORKER_ID", "str", "", "this elastic worker's name in the driver's assignments"),
    Setting(
        "BUDDY_SHARED_MEMORY",
        "bool",
        True,
        "elastic ZeRO: a buddy copy between ranks sharing /dev/shm is the owner's packed copy in a"
        " file the buddy maps (no bytes moved); 0 sends it point-to-point as across machines",
    ),
    # Runtime behaviour.
    Setting(
        "FUSION_THRESHOLD",
        "int",
        64 * 1024 * 1024,
        "bytes: ready tensors of one kind are fused up to this size",
    ),
    Setting(
        "CYCLE_TIME",
        "float",
        0.0,
        "ms the coordinator holds ready tensors so more can join one fused collective; 0 = send at once",
    ),
    Setting(
        "CACHE_CAPACITY",
        "int",
        1024,
        "tensor signatures remembered (LRU, admitted when seen twice) so steady-state requests are"
        " a few bytes; 0 = no cache",
    ),
    Setting(
        "STEADY_STATE",
        "bool",
        True,
        "once every rank has submitted the same named tensors in the same order twice, run them"
        " without the round trip to the coordinator (each rank tells the others it is ready, and"
        " a small allreduce's input travels in that message; barrier() between steps keeps it);"
        " any change falls back to full negotiation. 0 = always negotiate",
    ),
    Setting("STALL_CHECK_DISABLE", "bool", False, "disable the stall inspector"),
    Setting(
        "DEADLOCK_CHECK_DISABLE",
        "bool",
        False,
        "disable the deadlock detector (fails at once what ranks blocked in synchronize() wait for"
        " when none of it can complete)",
    ),
    Setting(
        "STALL_CHECK_TIME_SECONDS",
        "float",
        60.0,
        "warn when a tensor waits this long for some ranks to submit it",
    ),
    Setting(
        "STALL_SHUTDOWN_TIME_SECONDS",
        "float",
        600.0,
        "fail a tensor stalled this long with an error on every rank (and with it every tensor stalled"
        " past the warning time); 0 = only warn, never fail",
    ),
    Setting(
        "TIMEOUT_SECONDS",
        "float",
        120.0,
        "seconds a transfer may make no progress before it fails (a hung peer)",
    ),
    Setting(
        "LIVENESS_SECONDS",
        "int",
        4,
        "seconds a peer may stay silent before it is declared dead and every rank is told (at least 2):"
        " a host that stops answering TCP keepalive probes or acknowledging data, or a rank whose"
        " process stops while its sockets stay open (SIGSTOP, a call that blocks every thread), which"
        " its ring neighbours find by a missing heartbeat; the kernel answers the probes and a core"
        " thread beats without the GIL, so a rank that computes for hours without a collective is"
        " never declared dead",
    ),
    Setting(
        "P2P_UNEXPECTED_BYTES",
        "int",
        1 << 30,
        "bytes of point-to-point messages a rank keeps while no recv has matched them (sent before"
        " the receiver posted); a message past this fails the job with an error naming sender and tag",
    ),
    Setting(
        "P2P_ARENA_BYTES",
        "int",
        16 << 20,
        "bytes of each rank's point-to-point arena in /dev/shm: messages to ranks on its host that"
        " share memory with it are written there once and copied out by the receiver (only the bytes"
        " in use at once take memory); 0 sends them through the control ring instead",
    ),
    Setting(
        "HIERARCHICAL_ALLREDUCE",
        "int",
        -1,
        "1: allreduce in two levels when the ranks span hosts (reduce-scatter inside each host, one"
        " cross-host ring per local rank, allgather inside the host); 0: one flat ring; -1: two levels"
        " from 1 MiB on. Both need every host to hold the same number (2+) of the ranks",
    ),
    Setting(
        "HIERARCHICAL_ALLGATHER",
        "int",
        -1,
        "1: allgather in two levels when the ranks span hosts (allgather inside each host, one"
        " cross-host ring per local rank carrying 1/local_size of each host's bytes, allgather inside"
        " the host); 0: one flat ring; -1: two levels from 1 MiB gathered on. Both need every host to"
        " hold the same number (2+) of consecutive ranks",
    ),
    Setting("SHM_DISABLE", "bool", False, "use TCP even between ranks on the same host (no shared memory)"),
    Setting(
        "SHM_CHANNEL_BYTES",
        "int",
        1 << 20,
        "most bytes of the shared-memory data ring per ordered pair of partner ranks on a host (a"
        " rank's rings share 3 MiB, so with many ranks on a host each ring is smaller)",
    ),
    Setting(
        "PIN_CORES",
        "bool",
        True,
        "when the ranks on a host exactly fill the CPUs they may use, pin each to its own core (as Open MPI does)",
    ),
    Setting(
        "SPIN_US",
        "float",
        50.0,
        "microseconds a waiting thread polls memory before it sleeps (transfers, idle background loop, synchronize): the most, lowered while waits keep ending in sleep (a busy host); 0 = sleep at once",
    ),
    Setting(
        "SHUTDOWN_TIMEOUT_SECONDS", "float", 15.0, "seconds shutdown() waits for the other ranks to shut down"
    ),
    Setting(
        "CHECKPOINT_COMMIT_SECONDS",
        "float",
        600.0,
        "seconds the first rank of a checkpoint's process set waits for the other ranks' files"
        " before it gives up on committing that checkpoint (the previous one stays)",
    ),
    Setting(
        "TIMELINE", "str", "", "write a Chrome trace of every tensor's life to this file (rank 0 writes it)"
    ),
    Setting(
        "TIMELINE_MARK_CYCLES", "bool", False, "mark each background-loop cycle that did work in the timeline"
    ),
    Setting(
        "AUTOTUNE",
        "bool",
        False,
        "tune fusion threshold and cycle time online by measured allreduce throughput",
    ),
    Setting(
        "AUTOTUNE_LOG",
        "str",
        "",
        "CSV file where the autotuner logs every setting it tried and the one it chose",
    ),
    Setting("AUTOTUNE_WARMUP_SAMPLES", "int", 1, "samples discarded after each change of settings"),
    Setting("AUTOTUNE_STEPS_PER_SAMPLE", "int", 10, "executed allreduce responses per autotune sample"),
    Setting(
        "CPU_OPERATIONS",
        "str",
        "auto",
        "backend for CPU tensors: ring (native TCP transport), mpi (MPI collectives; needs a build with MPI and a job started by mpirun) or auto (per collective and size, the faster of the two as measured; today the ring everywhere on one host)",
    ),
    Setting("LOG_LEVEL", "str", "warning", "trace, debug, info, warning, error or fatal"),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def _parse(setting, text):
    if setting.type == "int":
        return int(text)
    if setting.type == "float":
        return float(text)
    if setting.type == "bool":
        return text.strip().lower() in ("1", "true", "yes", "on")
    return text


def get(name, environ=None):
    """The value of setting `name` as this process's environment gives it."""
    env = os.environ if environ is None else environ
    setting = _BY_NAME[name]
    for prefix in ("HVDLITE_", "HOROVOD_"):
        text = env.get(prefix + name)
        if text is not None and text != "":
            return _parse(setting, text)
    return setting.default


def _cpp_literal(setting):
    if setting.type == "str":
        return '"%s"' % setting.default.replace("\\", "\\\\").replace('"', '\\"')
    if setting.type == "bool":
        return "true" if setting.default else "false"
    return repr(setting.default)


def cpp_header():
    """X-macro list consumed by csrc/common/config.h."""
    lines = [
        "// Generated from hvdlite/common/settings.py. Do not edit.",
        "// HVD_SETTING(name, cpp_type, default, doc)",
    ]
    cpp_types = {"int": "int64_t", "float": "double", "bool": "bool", "str": "std::string"}
    for s in SETTINGS:
        doc = s.doc.replace("\\", "\\\\").replace('"', '\\"')
        lines.append('HVD_SETTING(%s, %s, %s, "%s")' % (s.name, cpp_types[s.type], _cpp_literal(s), doc))
    return "\n".join(lines) + "\n"


def markdown_table():
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        rows.append("| `HVDLITE_%s` | %s | `%r` | %s |" % (s.name, s.type, s.default, s.doc))
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cpp-header":
        text = cpp_header()
        try:
            with open(sys.argv[2]) as f:
                if f.read() == text:
                    sys.exit(0)  # unchanged: keep the timestamp, avoid rebuilds
        except OSError:
            pass
        with open(sys.argv[2], "w") as f:
            f.write(text)
    elif len(sys.argv) == 2 and sys.argv[1] == "--markdown":
        print(markdown_table())
    else:
        sys.exit("usage: settings.py --cpp-header OUT | --markdown")
