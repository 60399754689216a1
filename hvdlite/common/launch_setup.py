"""What hvd.init() does before the core's init() when a launcher other than hvdlite's own started
this process: finds the launcher (hvdlite.common.launchers.detect), settles the job's secret,
hosts the store on the process the launcher's variables name for it, hands its address over where
it is not derived from those variables, and writes the job description into this process's
environment (hvdlite.common.job.write), where the core reads it.

The secret, in this order (docs/launchers.md, "The job secret"):
  1. HVDLITE_SECRET (hex), the same in every process: what hvdlite's own launchers hand out;
  2. HVDLITE_SECRET_FILE: a file holding it (hex), e.g. on a shared filesystem;
  3. under torchrun's agent: rank 0 draws a random one and hands it over with the store's address
     through the agent's store, so the job is as closed as torch.distributed's own store is;
  4. otherwise (srun, or torch's variables without the agent) it is derived from the launcher's
     public job id: processes of other jobs and steps are refused, but any process that reaches
     the port and knows the id could join. The process hosting the store says so on stderr, every
     time, so strangers are never accepted silently.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys

from hvdlite.common import exceptions, launchers, settings
from hvdlite.common import job as jobs
from hvdlite.common.native import core as _core

_server = None  # the store this process hosts: kept until the process exits (init after shutdown)
_prepared: tuple[str, jobs.Job | None] | None = (
    None  # (launcher name, job) of this process once prepare() has written the job
)


def _say(level, rank, text):
    sys.stderr.write("[hvdlite %s rank %s] %s\n" % (level, rank, text))
    sys.stderr.flush()


def _debug_on(env):
    return str(settings.get("LOG_LEVEL", env)).lower() in ("trace", "debug")


def resolve_secret(plan, env):
    """(secret hex or None: rank 0 draws one under torchrun's agent, where it comes from)."""
    text = settings.get("SECRET", env)
    source = "HVDLITE_SECRET"
    path = settings.get("SECRET_FILE", env)
    if not text and path:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError as e:
            raise exceptions.InvalidArgumentError(
                "HVDLITE_SECRET_FILE=%s cannot be read: %s" % (path, e)
            ) from e
        source = "HVDLITE_SECRET_FILE=%s" % path
    if text:
        try:
            bytes.fromhex(text)
        except ValueError:
            raise exceptions.InvalidArgumentError(
                "%s is not hex (e.g. `openssl rand -hex 32`)" % source
            ) from None
        return text, source
    if plan.agent_store is not None:
        host, port, _ = plan.agent_store
        return None, "random, handed over through torchrun's store at %s:%d" % (host, port)
    derived = hashlib.sha256(b"hvdlite-public-job-id:" + plan.job_id.encode()).hexdigest()
    return derived, "derived from the job id %s (no HVDLITE_SECRET)" % plan.job_id


def _is_local_address(host):
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return False
    for info in infos:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((info[4][0], 0))
                return True
            except OSError:
                pass
    return False


def route_address(host):
    """This host's address that routes to `host` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])


def advertised_host(plan):
    """The address the other processes reach this process's store at."""
    if plan.bind_host == "127.0.0.1":
        return "127.0.0.1"
    if _is_local_address(plan.store_host):
        return str(plan.store_host)  # the others reach this host there already (the agent's store)
    return route_address(plan.store_host)


def node_address(name):
    """A Slurm node's address: its name where that resolves, else its NodeAddr (scontrol)."""
    try:
        socket.getaddrinfo(name, None, socket.AF_INET)
        return name
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", name, "-o"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise exceptions.InvalidArgumentError(
        "srun: the step's first node %r, where the store is, does not resolve and scontrol does not "
        "know its address" % name
    )


def _host_store(plan, secret_hex):
    global _server
    try:
        _server = _core.TcpStoreServer(
            plan.bind_host, plan.bind_port, bytes.fromhex(secret_hex), clients=2 * plan.job.size
        )
    except RuntimeError as e:
        raise exceptions.HvdliteInternalError(
            "%s: rank %d cannot host the job's store on %s:%d: %s"
            % (plan.name, plan.job.rank, plan.bind_host, plan.bind_port, e)
        ) from e
    return _server.port


def _agent_store(plan, timeout_s):
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    host, port, _ = plan.agent_store
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def _through_agent(plan, secret, timeout_s):
    """Rank 0 hosts the store and publishes it in torchrun's store; the others read it there.
    Returns (store_addr, secret hex)."""
    key = plan.agent_store[2]
    try:
        store = _agent_store(plan, timeout_s)
        if plan.host_store:
            mine = secret or os.urandom(32).hex()
            addr = "%s:%d" % (advertised_host(plan), _host_store(plan, mine))
            store.set(key, json.dumps({"addr": addr, "secret": None if secret else mine}))
            return addr, mine
        record = json.loads(store.get(key))
    except (RuntimeError, OSError) as e:  # torch's DistStoreError is a RuntimeError
        if isinstance(e, exceptions.HvdliteError):
            raise
        raise exceptions.HvdliteInternalError(
            "torchrun: rank %d could not exchange the store's address through the agent's store at "
            "%s:%d within %.0f s (HVDLITE_START_TIMEOUT): %s"
            % ((plan.job.rank,) + plan.agent_store[:2] + (timeout_s, e))
        ) from e
    return record["addr"], secret or record["secret"]


def join_through(rank, size, publish, fetch, host_address, timeout_s, env=None):
    """Forms the job description of a process that a framework's own rendezvous placed (torch's
    init_process_group with an init_method or store and no launcher variables): rank 0 hosts the
    store on every interface and publishes its address and a fresh secret with `publish(text)`;
    the others read them with `fetch()` (which blocks at most `timeout_s`, the framework's own
    bound). The secret travels through the framework's store, so the job is exactly as closed as
    that store. Writes the job into `env` (os.environ) for the core, as prepare() does."""
    env = os.environ if env is None else env
    if size == 1:
        jobs.write(env, jobs.Job(rank=0, size=1))
        return
    if rank == 0:
        global _server
        secret = os.urandom(32).hex()
        try:
            _server = _core.TcpStoreServer("0.0.0.0", 0, bytes.fromhex(secret), clients=2 * size)
        except RuntimeError as e:
            raise exceptions.HvdliteInternalError("rank 0 cannot host the job's store: %s" % e) from e
        addr = "%s:%d" % (host_address, _server.port)
        publish(json.dumps({"addr": addr, "secret": secret}))
    else:
        try:
            record = json.loads(fetch())
        except (RuntimeError, OSError) as e:
            raise exceptions.HvdliteInternalError(
                "rank %d could not read the hvdlite store's address from rank 0 within %.0f s: %s"
                % (rank, timeout_s, e)
            ) from e
        addr, secret = record["addr"], record["secret"]
    jobs.write(env, jobs.Job(rank=rank, size=size, store_addr=addr, secret=secret))


def _setup(plan, env):
    """The complete job description of this process under `plan`."""
    job = plan.job
    if job.size == 1:
        return job, "none (a 1-process job needs no store)"
    secret, source = resolve_secret(plan, env)
    if plan.agent_store is not None:
        addr, secret = _through_agent(plan, secret, float(settings.get("START_TIMEOUT", env)))
        return job._replace(store_addr=addr, secret=secret), source
    if plan.store_host is not None and job.store_addr is None:
        job = job._replace(store_addr="%s:%d" % (node_address(plan.store_host), plan.bind_port))
    if plan.host_store:
        _host_store(plan, secret)
        if source.startswith("derived"):
            _say(
                "WARNING",
                job.rank,
                "%s: the job's store at %s admits any process that reaches it and knows the job id "
                "%s: set HVDLITE_SECRET (hex, e.g. `export HVDLITE_SECRET=$(openssl rand -hex 32)` "
                "before the launcher) or HVDLITE_SECRET_FILE in every process to keep strangers out"
                % (plan.name, job.store_addr, plan.job_id),
            )
    return job._replace(secret=secret), source


def _describe(name, job, source):
    def pair(a, b):
        return "from the host names" if a is None else "%s of %s" % (a, b)

    return "launcher: %s: rank %s, local %s, cross %s, store %s, secret: %s" % (
        name,
        pair(job.rank, job.size),
        pair(job.local_rank, job.local_size),
        pair(job.cross_rank, job.cross_size),
        job.store_addr,
        source,
    )


def prepare(env=None):
    """Called by hvd.init() before the core's init(): see the module doc. Returns the launcher's
    name (None: a 1-process job)."""
    global _prepared
    env = os.environ if env is None else env
    if _prepared is not None and jobs.read(env) == _prepared[1]:
        return _prepared[0]  # init() after shutdown(): the same job, the same store
    try:
        plan = launchers.detect(env)
    except launchers.LauncherEnvError as e:
        raise exceptions.InvalidArgumentError("hvd.init(): %s" % e) from None
    if plan.job is None:
        if _debug_on(env):
            what = {"hvdliterun": "the HVDLITE_* variables", "mpirun": "MPI forms the job"}
            _say(
                "DEBUG",
                settings.get("RANK", env),
                "launcher: %s (%s)" % (plan.name, what.get(plan.name, "1 process")),
            )
        return plan.name
    job, source = _setup(plan, env)
    jobs.write(env, job)
    _prepared = (plan.name, jobs.read(env))
    if _debug_on(env):
        _say("DEBUG", job.rank, _describe(plan.name, job, source))
    return plan.name
