"""hvd.init() under launchers other than hvdlite's own, for real: torchrun from the installed torch
(one node, an elastic restart, and two simulated hosts with the c10d rendezvous), the digits demo
under torchrun and under mpirun, torch's variables
without the agent (Kubeflow PyTorchJob's pods), and srun's variables (the Slurm cluster itself:
tests/test_slurm.py). Each runs tests/launched_allreduce.py, which has nothing launcher-specific."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_helpers import MPIRUN, skip_without_mpi

from hvdlite.runner import mpi_launch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "tests" / "launched_allreduce.py")
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")


def clean_env(**extra):
    """Our environment without any launcher's identity, plus `extra`."""
    drop = ("HVDLITE_", "HOROVOD_", "SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "PMIX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def results(stdout):
    """{rank: record} of the JSON lines the ranks printed."""
    out, decoder, pos = {}, json.JSONDecoder(), 0
    while (pos := stdout.find('{"rank"', pos)) >= 0:
        record, end = decoder.raw_decode(stdout, pos)
        out[record["rank"]] = record
        pos = end
    return out


def check_job(found, size, local_size):
    assert sorted(found) == list(range(size)), found
    for rank, r in found.items():
        assert r["size"] == size and r["sum"] == size * (size + 1) / 2
        assert r["local"] == [rank % local_size, local_size]
        assert r["cross"] == [rank // local_size, size // local_size]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun (from torch) is not installed")


@needs_torchrun
def _two_processes(env_of_rank):
    """Runs SCRIPT as ranks 0 and 1 with env_of_rank(rank), as a launcher would have started
    them; asserts both exit 0 and returns their (stdout, stderr). Bounded at 120 s."""
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT],
            env=env_of_rank(r),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs


def test_torchrun_one_node_two_processes():
    proc = subprocess.run(
        [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", SCRIPT],
        env=clean_env(HVDLITE_LOG_LEVEL="debug"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_job(results(proc.stdout), 2, 2)
    assert "launcher: torchrun: rank 1 of 2, local 1 of 2, cross 0 of 1" in proc.stderr
    assert "secret: random, handed over through torchrun's store" in proc.stderr


@pytest.mark.slow
@needs_torchrun
def test_torchrun_restart_reforms_the_job():
    proc = subprocess.run(
        [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "1", SCRIPT],
        env=clean_env(CRASH_ON_FIRST_ATTEMPT="1"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = results(proc.stdout)
    check_job(found, 2, 2)
    assert {r["restart"] for r in found.values()} == {"1"}


def test_torch_variables_without_an_agent():
    """Kubeflow PyTorchJob's pods (one process each, no torchrun): rank 0 hosts the store beside
    MASTER_PORT; with HVDLITE_SECRET given, nothing else is needed."""
    port = free_port()
    common = dict(WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HVDLITE_SECRET="ab" * 32)
    outs = _two_processes(lambda r: clean_env(RANK=r, HVDLITE_LOG_LEVEL="debug", **common))
    found = results(outs[0][0] + outs[1][0])
    assert sorted(found) == [0, 1] and all(r["sum"] == 3.0 for r in found.values())
    assert "launcher: torch-env: rank 1 of 2, local from the host names" in outs[1][1]
    assert "store 127.0.0.1:%d" % (port + 1) in outs[1][1]


def test_srun_variables_without_a_secret_warn():
    """srun's step variables on one node (what tests/test_slurm.py gets from a real slurmd): local
    task 0 hosts the store on the port derived from the job and step ids, and says that without
    HVDLITE_SECRET any process reaching it could join."""
    job_id = str(100000 + os.getpid())
    common = dict(
        SLURM_JOB_ID=job_id,
        SLURM_STEP_ID=0,
        SLURM_STEP_NUM_TASKS=2,
        SLURM_STEP_NODELIST="localhost",
        SLURM_STEP_TASKS_PER_NODE=2,
        SLURMD_NODENAME="localhost",
    )
    outs = _two_processes(lambda r: clean_env(SLURM_PROCID=r, SLURM_LOCALID=r, **common))
    check_job(results(outs[0][0] + outs[1][0]), 2, 2)
    assert "admits any process that reaches it and knows the job id slurm:%s.0" % job_id in outs[0][1]
    assert "admits any process" not in outs[1][1]


@pytest.mark.slow
@needs_torchrun
def test_torchrun_trains_the_digits_demo_unchanged():
    demo = str(REPO / "examples" / "pytorch_digits.py")
    proc = subprocess.run(
        [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", demo, "--epochs", "1"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "on 2 ranks" in proc.stdout, proc.stdout


@pytest.mark.slow
@skip_without_mpi
def test_mpirun_trains_the_digits_demo_unchanged():
    """The demo (what `make demo` runs) under a plain `mpirun -n 2`: hvd.init() takes the job
    from Open MPI's variables."""
    demo = str(REPO / "examples" / "pytorch_digits.py")
    argv = mpi_launch.mpirun_command(2, [sys.executable, demo, "--epochs", "1"], mpirun=MPIRUN)
    proc = subprocess.run(
        argv, env=mpi_launch.mpirun_env(clean_env()), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "on 2 ranks" in proc.stdout, proc.stdout


@pytest.mark.slow
@needs_torchrun
def test_torchrun_c10d_across_two_hosts(simhosts):
    """Kubeflow PyTorchJob's path: torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d on
    two simulated hosts (each its own network namespace, hostname and /dev/shm)."""
    cluster = simhosts(2)
    endpoint = "%s:%d" % (cluster.hosts[0].addr, 29400)
    env = clean_env()
    exports = " ".join("%s=%s" % (k, env[k]) for k in ("PYTHONPATH", "OMP_NUM_THREADS", "PATH"))
    command = (
        "cd %s && env %s %s --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint %s "
        "--rdzv-id hvd --local-addr %%s %s" % (REPO, exports, TORCHRUN, endpoint, SCRIPT)
    )
    procs = [
        subprocess.Popen(
            ["/usr/bin/ssh", "-F", cluster.ssh_config, h.addr, command % h.addr],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for h in cluster.hosts
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    found = results(outs[0][0] + outs[1][0])
    check_job(found, 4, 2)
    assert len({r["host"] for r in found.values()}) == 2


@pytest.mark.slow
def test_mpijob_style_mpirun_with_an_exec_agent_and_no_ssh(simhosts, tmp_path):
    """Kubeflow MPIJob's path: mpirun with a hostfile, its ranks started on the other hosts by an
    exec agent (the operator's kubectl-exec stand-in: nsenter into the host's namespaces) instead
    of ssh; hvd.init() takes the job from MPI."""
    if shutil.which("mpirun") is None or shutil.which("nsenter") is None:
        pytest.skip("mpirun (Open MPI) or nsenter is not installed")
    cluster = simhosts(2)
    agent = tmp_path / "kubexec.sh"
    cases = "".join('  %s) pid=%d ;;\n' % (h.addr, h.holder.pid) for h in cluster.hosts)
    agent.write_text(
        '#!/bin/sh\n# like the MPI Operator\'s kubexec.sh: run "$*" in the pod named by $1\n'
        'case "$1" in\n%s  *) echo "no such pod: $1" >&2; exit 2 ;;\nesac\nshift\n'
        'exec nsenter -t "$pid" -n -u -m -- /bin/sh -c "$*"\n' % cases
    )
    agent.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join("%s slots=2\n" % h.addr for h in cluster.hosts))
    subnet = cluster.subnet + ".0/24"
    env = clean_env(PATH="/nonexistent-ssh-free:" + os.environ["PATH"])
    argv = [
        "mpirun", "--allow-run-as-root", "-np", "4", "--hostfile", str(hostfile),
        "-mca", "plm_rsh_agent", str(agent), "-mca", "btl_tcp_if_include", subnet,
        "-mca", "oob_tcp_if_include", subnet, "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
        sys.executable, SCRIPT,
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    found = results(proc.stdout)
    check_job(found, 4, 2)
    assert [found[r]["host"] for r in range(4)] == [h.name for h in cluster.hosts for _ in range(2)]


@pytest.mark.slow
@needs_torchrun
def test_torchrun_node_joining_reforms_the_job_larger(simhosts, tmp_path):
    """torchrun --nnodes 1:2 (c10d): host A runs alone; when host B's agent arrives, A's agent
    stops its workers and both start a 4-rank job with the same restart count. With torch 2.13 the
    agents' shared store deadlocks on such a scale-up (the new node waits for a MASTER_ADDR key of
    the new round that rank 0's agent, keeping its old server, never writes), so the agents run
    with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers then have no agent store
    (TORCHELASTIC_USE_AGENT_STORE=False) and hvdlite's store stands beside each round's
    MASTER_PORT; the secret comes from HVDLITE_SECRET. last_call_timeout (torchrun's default
    30 s) is how long a round that has its minimum of nodes waits for more before it starts: A
    waits it out alone first, and B, polling every second from the wait list, joins the
    second round well within it."""
    import time

    cluster = simhosts(2)
    endpoint = "%s:%d" % (cluster.hosts[0].addr, 29400)
    env = clean_env(
        LOOP_STEPS=60, LOOP_SLEEP=0.1, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, HVDLITE_SECRET="ef" * 32
    )
    names = ("PYTHONPATH", "OMP_NUM_THREADS", "PATH", "LOOP_STEPS", "LOOP_SLEEP")
    names += ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "HVDLITE_SECRET")
    exports = " ".join("%s=%s" % (k, env[k]) for k in names)
    command = (
        "cd %s && env %s %s --nnodes 1:2 --nproc-per-node 2 --max-restarts 2 --rdzv-backend c10d "
        "--rdzv-endpoint %s --rdzv-id grow --rdzv-conf last_call_timeout=10 --local-addr %%s %s"
        % (REPO, exports, TORCHRUN, endpoint, SCRIPT)
    )

    def start(i):
        h = cluster.hosts[i]
        with open(tmp_path / ("host%d.out" % i), "w") as out, open(tmp_path / ("host%d.err" % i), "w") as err:
            return subprocess.Popen(
                ["/usr/bin/ssh", "-F", cluster.ssh_config, h.addr, command % h.addr],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    first = start(0)
    deadline = time.monotonic() + 120
    while "LOOPING size 2" not in (tmp_path / "host0.err").read_text():
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "host0.err").read_text()
        time.sleep(0.2)
    second = start(1)
    codes = [p.wait(timeout=240) for p in (first, second)]
    texts = [(tmp_path / ("host%d.%s" % (i, s))).read_text() for i in range(2) for s in ("out", "err")]
    assert codes == [0, 0], texts
    found = results(texts[0] + texts[2])
    check_job(found, 4, 2)
    assert "LOOPING size 4" in texts[1]
    assert {r["restart"] for r in found.values()} == {"0"}  # a membership change, not a failure
