"""The launcher detection of hvd.init() (hvdlite/common/launchers.py) on each launcher's variable
sets, and the one table of identity variables (hvdlite/common/job.py). Pure functions: no process
is started here (tests/test_launchers_run.py runs the launchers for real)."""

import pytest

from hvdlite.common import job as jobs
from hvdlite.common import launch_setup, launchers
from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.common.job import Job

TORCHRUN_2X2_RANK3 = {  # what torchrun --nnodes 2 --nproc-per-node 2 gives global rank 3
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "3",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job7",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}

SRUN_N2_N4_RANK2 = {  # srun -N2 -n4 on nodes n1, n2: task 2 is the first on n2
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "3",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "n2",
}


def test_order_hvdliterun_and_mpirun_come_first():
    both = dict(TORCHRUN_2X2_RANK3, **SRUN_N2_N4_RANK2)
    assert launchers.detect(dict(both, HVDLITE_RANK="0", HVDLITE_SIZE="2")).name == "hvdliterun"
    assert launchers.detect(dict(both, HOROVOD_RANK="0")).name == "hvdliterun"
    assert launchers.detect(dict(both, HVDLITE_ELASTIC_STORE_ADDR="h:1")).name == "hvdliterun"
    assert launchers.detect(dict(both, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2")).name == "mpirun"
    assert launchers.detect(dict(both, PMI_RANK="1", PMI_SIZE="2")).name == "mpirun"
    # torchrun under srun (pytorch#137402): torchrun's variables are the job's.
    assert launchers.detect(both).name == "torchrun"
    assert launchers.detect(SRUN_N2_N4_RANK2).name == "srun"
    assert launchers.detect({"PATH": "/bin"}) == launchers.Plan(None)
    # A batch script's own environment has no step: a 1-process job, not rank 0 of SLURM_NTASKS.
    batch = {k: v for k, v in SRUN_N2_N4_RANK2.items() if not k.startswith("SLURM_STEP_")}
    assert launchers.detect(batch).name is None


def test_torchrun_with_the_agent_store():
    plan = launchers.detect(TORCHRUN_2X2_RANK3)
    assert plan.name == "torchrun"
    assert plan.job == Job(3, 4, 1, 2, 1, 2)
    assert not plan.host_store and plan.bind_port == 0
    assert plan.agent_store == ("10.0.0.1", 29500, "hvdlite/job7/2/4/store")
    rank0 = launchers.detect(dict(TORCHRUN_2X2_RANK3, RANK="0", LOCAL_RANK="0", GROUP_RANK="0"))
    assert rank0.host_store and rank0.job == Job(0, 4, 0, 2, 0, 2) and rank0.bind_host == "0.0.0.0"
    one_node = dict(TORCHRUN_2X2_RANK3, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", GROUP_RANK="0")
    one_node.update(GROUP_WORLD_SIZE="1")
    assert launchers.detect(one_node).bind_host == "127.0.0.1"


def test_torch_variables_without_the_agent_stand_beside_master_port():
    # Kubeflow PyTorchJob, one process per pod: no LOCAL_WORLD_SIZE, no agent.
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "master-0", "MASTER_PORT": "23456"}
    plan = launchers.detect(env)
    assert plan.name == "torch-env" and plan.agent_store is None
    assert plan.job == Job(1, 3, store_addr="master-0:23457")  # the core computes local/cross
    assert launchers.detect(dict(env, RANK="0")).host_store
    assert launchers.detect(dict(env, TORCHELASTIC_RUN_ID="x")).name == "torchrun"
    with pytest.raises(launchers.LauncherEnvError, match="RANK=3 and WORLD_SIZE=3"):
        launchers.detect(dict(env, RANK="3"))
    with pytest.raises(launchers.LauncherEnvError, match="WORLD_SIZE='four'"):
        launchers.detect(dict(env, WORLD_SIZE="four"))


def test_srun_step_topology_and_store():
    plan = launchers.detect(SRUN_N2_N4_RANK2)
    assert plan.name == "srun" and plan.job == Job(2, 4, 0, 2, 1, 2)
    assert plan.store_host == "n1" and not plan.host_store and plan.bind_host == "0.0.0.0"
    assert plan.bind_port == launchers.store_port("4242", "3")
    assert launchers.SLURM_PORT_BASE <= plan.bind_port < launchers.SLURM_PORT_BASE + launchers.SLURM_PORT_SPAN
    assert plan.bind_port != launchers.store_port("4242", "4")
    host = dict(SRUN_N2_N4_RANK2, SLURM_PROCID="0", SLURMD_NODENAME="n1", SLURM_NODEID="0")
    assert launchers.detect(host).host_store
    # Step-scoped beats job-scoped: a 1-task step inside a 4-task allocation.
    step = dict(SRUN_N2_N4_RANK2, SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="1", SLURMD_NODENAME="n1")
    step.update(SLURM_STEP_NODELIST="n1", SLURM_STEP_TASKS_PER_NODE="1")
    one_node = launchers.detect(step)
    assert one_node.job == Job(0, 1, 0, 1, 0, 1, "127.0.0.1:%d" % one_node.bind_port)
    assert one_node.bind_host == "127.0.0.1"


def test_srun_uneven_nodes_cross_topology():
    # 3 tasks on a, 1 on b, 2 on c: local rank 1 exists on a and c only.
    env = dict(SRUN_N2_N4_RANK2, SLURM_STEP_NODELIST="a,b,c", SLURM_STEP_TASKS_PER_NODE="3,1,2")
    env.update(SLURM_STEP_NUM_TASKS="6", SLURM_PROCID="5", SLURM_LOCALID="1", SLURMD_NODENAME="c")
    assert launchers.detect(env).job == Job(5, 6, 1, 2, 1, 2)
    env.update(SLURM_PROCID="2", SLURM_LOCALID="2", SLURMD_NODENAME="a")
    assert launchers.detect(env).job == Job(2, 6, 2, 3, 0, 1)
    bad = dict(env, SLURM_STEP_TASKS_PER_NODE="3,1")
    with pytest.raises(launchers.LauncherEnvError, match="does not fit"):
        launchers.detect(bad)


def test_slurm_lists():
    assert launchers.expand_nodelist("n[01-03,7],gpu1") == ["n01", "n02", "n03", "n7", "gpu1"]
    assert launchers.expand_nodelist("r[1-2]-n[3-4]") == ["r1-n3", "r1-n4", "r2-n3", "r2-n4"]
    assert launchers.expand_nodelist("localhost") == ["localhost"]
    assert launchers.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(launchers.LauncherEnvError):
        launchers.expand_tasks_per_node("2(y3)")


def test_the_identity_table_writes_and_clears_every_name():
    env = {"HOROVOD_LOCAL_RANK": "7", "HVDLITE_HOSTNAME": "mine", "HOROVOD_SECRET": "ab", "PATH": "/bin"}
    jobs.write(env, Job(1, 2, store_addr="h:1", secret="cd"))
    assert env == {
        "HVDLITE_RANK": "1",
        "HOROVOD_RANK": "1",
        "HVDLITE_SIZE": "2",
        "HOROVOD_SIZE": "2",
        "HVDLITE_STORE_ADDR": "h:1",
        "HVDLITE_SECRET": "cd",
        "HVDLITE_HOSTNAME": "mine",  # kept: the job gives no host name
        "PATH": "/bin",
    }
    assert jobs.read(env) == Job(1, 2, store_addr="h:1", secret="cd", hostname="mine")
    assert jobs.read({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4"}) == Job(3, 4)
    assert jobs.read({"PATH": "/bin"}) is None
    assert jobs.clear(env) == {"HVDLITE_HOSTNAME": "mine", "PATH": "/bin"}
    record = {"store_addr": "s:2", "secret": "ef", "workers": {"w": {"rank": 0, "size": 1, "hostname": "h"}}}
    assert jobs.generation_job(record, "w") == Job(0, 1, store_addr="s:2", secret="ef", hostname="h")


def test_secret_sources(tmp_path):
    plan = launchers.detect(SRUN_N2_N4_RANK2)
    assert launch_setup.resolve_secret(plan, {"HVDLITE_SECRET": "abcd"}) == ("abcd", "HVDLITE_SECRET")
    path = tmp_path / "secret"
    path.write_text("0123\n")
    got = launch_setup.resolve_secret(plan, {"HVDLITE_SECRET_FILE": str(path)})
    assert got == ("0123", "HVDLITE_SECRET_FILE=%s" % path)
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        launch_setup.resolve_secret(plan, {"HVDLITE_SECRET_FILE": str(tmp_path / "none")})
    with pytest.raises(InvalidArgumentError, match="not hex"):
        launch_setup.resolve_secret(plan, {"HVDLITE_SECRET": "xyz"})
    derived, source = launch_setup.resolve_secret(plan, {})
    assert len(derived) == 64 and "slurm:4242.3" in source
    assert launch_setup.resolve_secret(launchers.detect(TORCHRUN_2X2_RANK3), {})[0] is None


def test_identity_variables_are_written_only_through_the_table():
    """Issue 27's rule: no module but hvdlite/common/job.py assigns an identity variable
    (env["HVDLITE_RANK"] = ..., or a {"HVDLITE_RANK": ...} literal); the others call jobs.write.
    remote_exec.py puts the secret back into a remote rank's environment from ssh's stdin (the
    transport of a finished environment, not a job description) and is the one exception."""
    import pathlib
    import re

    import hvdlite

    names = "|".join(re.escape(n) for n in jobs.names())
    assignment = re.compile(r'\[\s*"(%s)"\s*\]\s*=[^=]|"(%s)"\s*:' % (names, names))
    allowed = {"common/job.py", "runner/remote_exec.py"}
    root = pathlib.Path(hvdlite.__file__).parent
    found = [
        "%s: %s" % (path.relative_to(root), m.group(0))
        for path in sorted(root.rglob("*.py"))
        if str(path.relative_to(root)) not in allowed
        for m in assignment.finditer(path.read_text())
    ]
    assert found == []


def test_store_addresses(monkeypatch, tmp_path):
    assert launch_setup.node_address("localhost") == "localhost"
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol to ask
    with pytest.raises(InvalidArgumentError, match=r"first node 'no-such-node\.invalid'"):
        launch_setup.node_address("no-such-node.invalid")
    one_node = launchers.detect(dict(TORCHRUN_2X2_RANK3, WORLD_SIZE="2", RANK="0", GROUP_WORLD_SIZE="1"))
    assert launch_setup.advertised_host(one_node) == "127.0.0.1"
    # Rank 0 on the agent's host (MASTER_ADDR is this machine): the others reach it there.
    local = launchers.detect(dict(TORCHRUN_2X2_RANK3, RANK="0", MASTER_ADDR="localhost"))
    assert launch_setup.advertised_host(local) == "localhost"
