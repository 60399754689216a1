"""Which launcher started this process, and the job description its variables give.

hvd.init() asks detect() first (through hvdlite.common.launch_setup), in this order; the first
that matches wins (docs/launchers.md):

  1. hvdliterun / horovodrun (and any launcher writing hvdlite's own variables): HVDLITE_RANK or
     HOROVOD_RANK is set, or HVDLITE_ELASTIC_STORE_ADDR (an elastic worker). Nothing to do here.
  2. mpirun (Open MPI, MPICH/Hydra): OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK with
     OMPI_COMM_WORLD_SIZE or PMI_SIZE, the rule of the core's Config. The core forms the job
     through MPI. Nothing to do here.
  3. torchrun, and whatever sets its variables (Kubeflow PyTorchJob, SageMaker, torchx): RANK,
     WORLD_SIZE, MASTER_ADDR and MASTER_PORT (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and
     GROUP_WORLD_SIZE when given). Rank 0 hosts the store. Under torchrun's agent
     (TORCHELASTIC_USE_AGENT_STORE=True) the agent's TCPStore holds MASTER_PORT: rank 0's store
     takes a free port and its address is handed over through the agent's store, under a key of
     this run, restart and world size (so a restarted or re-formed job never reads an old one).
     Without the agent, MASTER_PORT is left to torch.distributed (rank 0's init_process_group
     listens there) and the store listens beside it, on MASTER_PORT + 1.
  4. Slurm's srun without MPI: SLURM_PROCID with the step's SLURM_STEP_NUM_TASKS (a batch
     script's own environment has no step and is a 1-process job). Rank SLURM_PROCID, size
     SLURM_STEP_NUM_TASKS, local rank SLURM_LOCALID, local size from SLURM_STEP_TASKS_PER_NODE
     at this node's place in SLURM_STEP_NODELIST. Local task 0 of the step's first node hosts
     the store on a port derived from the job and step ids (store_port()).
  5. Otherwise a 1-process job.

Everything here is a pure function of the environment mapping; launch_setup does the rest.
"""

import collections
import hashlib
import re

from hvdlite.common import exceptions, settings
from hvdlite.common.job import Job

# What the setup must do for a detected launcher.
#   name: the launcher ("hvdliterun", "mpirun", "torchrun", "torch-env", "srun"; None: 1 process)
#   job: the description so far (store_addr None: it comes from the agent's store)
#   host_store: this process hosts the store, listening on (bind_host, bind_port; 0 = any port)
#   agent_store: (host, port, key) of torchrun's agent store to hand the address over, or None
#   job_id: the launcher's public name of this job (a secret derived from it keeps other jobs'
#     processes out, not strangers)
#   store_host: the host name whose address the store listens on (resolved by launch_setup)
Plan = collections.namedtuple(
    "Plan",
    "name job host_store bind_host bind_port agent_store job_id store_host",
    defaults=(None, None, False, None, 0, None, "", None),
)

MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
TORCH_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM_PORT_BASE, SLURM_PORT_SPAN = 10000, 20000


class LauncherEnvError(exceptions.InvalidArgumentError):
    """The launcher's variables do not describe a job (names the variable and its value)."""


def _int(env, name, default=None):
    text = env.get(name, "")
    if text == "":
        if default is not None:
            return default
        raise LauncherEnvError("%s is not set" % name)
    try:
        return int(text)
    except ValueError:
        raise LauncherEnvError("%s=%r is not an integer" % (name, text)) from None


def _set(env, names):
    return any(env.get(n, "") != "" for n in names)


def detect(env):
    """The Plan of the launcher that started a process with environment `env` (module doc)."""
    if settings.get("RANK", env) >= 0 or settings.get("SIZE", env) >= 0:
        return Plan("hvdliterun")
    if settings.get("ELASTIC_STORE_ADDR", env):
        return Plan("hvdliterun")
    if _set(env, MPI_RANK_VARS) and _set(env, MPI_SIZE_VARS):
        return Plan("mpirun")
    if all(env.get(n, "") != "" for n in TORCH_REQUIRED):
        return torch_plan(env)
    if env.get("SLURM_PROCID", "") != "" and env.get("SLURM_STEP_NUM_TASKS", "") != "":
        return slurm_plan(env)
    return Plan(None)


def _cross(rank, local_rank, counts, node):
    """Horovod's cross rank and size of local rank `local_rank` on node index `node`, where
    counts[i] processes run on node i: the nodes that run a process of that local rank."""
    holders = [i for i, n in enumerate(counts) if n > local_rank]
    return holders.index(node), len(holders)


def torch_plan(env):
    """torchrun's variables (and those of anything that sets them): the Plan."""
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if not 0 <= rank < size:
        raise LauncherEnvError("RANK=%d and WORLD_SIZE=%d do not describe a job" % (rank, size))
    topo = {}
    local_size = _int(env, "LOCAL_WORLD_SIZE", -1)
    if local_size > 0 and env.get("LOCAL_RANK", "") != "":
        # torchrun starts LOCAL_WORLD_SIZE processes on every node, node after node.
        topo = dict(local_rank=_int(env, "LOCAL_RANK"), local_size=local_size)
        if size % local_size == 0:
            topo["cross_size"] = _int(env, "GROUP_WORLD_SIZE", size // local_size)
            topo["cross_rank"] = _int(env, "GROUP_RANK", rank // local_size)
    master, port = env["MASTER_ADDR"], _int(env, "MASTER_PORT")
    one_node = topo.get("local_size") == size
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    job_id = "torch:%s:%d:%s:%s" % (master, port, run_id, restart)
    bind = "127.0.0.1" if one_node else "0.0.0.0"
    if agent:
        key = "hvdlite/%s/%s/%d/store" % (run_id, restart, size)
        return Plan(
            "torchrun", Job(rank, size, **topo), rank == 0, bind, 0, (master, port, key), job_id, master
        )
    store_port = port + 1
    name = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "torch-env"
    job = Job(rank, size, store_addr="%s:%d" % (master, store_port), **topo)
    return Plan(name, job, rank == 0, "0.0.0.0", store_port, None, job_id, master)


def store_port(job_id, step_id):
    """The port of a Slurm step's store: SLURM_PORT_BASE + (a hash of job and step) mod
    SLURM_PORT_SPAN, below Linux's ephemeral ports, so concurrent steps rarely meet."""
    digest = hashlib.sha256(("%s.%s" % (job_id, step_id)).encode()).digest()
    return SLURM_PORT_BASE + int.from_bytes(digest[:4], "big") % SLURM_PORT_SPAN


def slurm_plan(env):
    """srun's step-scoped variables: the Plan."""
    rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
    local_rank = _int(env, "SLURM_LOCALID", 0)
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    counts = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    if not nodes:
        raise LauncherEnvError("SLURM_STEP_NODELIST is not set")
    me = env.get("SLURMD_NODENAME", "")
    node = nodes.index(me) if me in nodes else _int(env, "SLURM_NODEID", 0)
    if len(counts) != len(nodes) or sum(counts) != size or not 0 <= node < len(nodes):
        raise LauncherEnvError(
            "SLURM_STEP_TASKS_PER_NODE=%r does not fit SLURM_STEP_NODELIST=%r (%d tasks, node %d)"
            % (env.get("SLURM_STEP_TASKS_PER_NODE"), env.get("SLURM_STEP_NODELIST"), size, node)
        )
    cross_rank, cross_size = _cross(rank, local_rank, counts, node)
    job_id, step_id = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "")), env.get("SLURM_STEP_ID", "")
    port = store_port(job_id, step_id)
    job = Job(rank, size, local_rank, counts[node], cross_rank, cross_size)
    bind = "0.0.0.0"
    if len(nodes) == 1:  # a one-node step: the store on loopback (no address to resolve)
        bind = "127.0.0.1"
        job = job._replace(store_addr="127.0.0.1:%d" % port)
    host_store = node == 0 and local_rank == 0
    return Plan("srun", job, host_store, bind, port, None, "slurm:%s.%s" % (job_id, step_id), nodes[0])


_BRACKET = re.compile(r"^([^\[]*)\[([^\]]*)\](.*)$")


def _split_top(text):
    """Splits at the commas outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [t for t in out if t]


def expand_nodelist(text):
    """Slurm's compressed host list ("n[01-03,7],gpu1") as a list of names, in order."""
    out = []
    for token in _split_top(text.strip()):
        m = _BRACKET.match(token)
        if not m:
            out.append(token)
            continue
        prefix, ranges, rest = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.extend(prefix + str(i).zfill(width) + tail for tail in expand_nodelist(rest) or [""])
    return out


def expand_tasks_per_node(text):
    """Slurm's "2(x3),1" as [2, 2, 2, 1]."""
    out = []
    for part in filter(None, text.split(",")):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if not m:
            raise LauncherEnvError("SLURM_STEP_TASKS_PER_NODE: cannot read %r" % part)
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out
