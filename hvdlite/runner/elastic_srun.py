"""Elastic hvdliterun under Slurm: `hvdliterun --srun -np 4 --min-np 2 python train.py` in an
allocation (sbatch or salloc) runs hvdlite's elastic driver (elastic_driver.py, its policy
unchanged) with each worker started as a one-task srun step on its node instead of over ssh.

Why one step per worker: tasks of one `srun -n4` step are one unit to Slurm, and no process of
that step outlives a failure to publish the job's next generation; with a step per worker, a
task that dies ends its own step only (srun exits non-zero), the driver blacklists its node as it
would any host, and the survivors, whose steps go on, re-form at the smaller size.

  - hosts: -H or --host-discovery-script as usual, else the allocation's nodes and their task
    counts (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE; fixed for the allocation's life);
  - each worker runs `srun --nodes=1 --ntasks=1 --nodelist=<node> --kill-on-bad-exit=0
    [--exact, inside an allocation] <command>` with the worker's environment (srun exports it);
  - srun forwards SIGTERM to its task, so stopping a worker sends srun SIGTERM (a SIGKILL of srun
    would leave the remote task running);
  - the stores listen on the address that routes to the first node's NodeAddr (`scontrol show
    node`), or on --network-interfaces.
"""

import os
import signal
import subprocess

from hvdlite.common import launchers
from hvdlite.runner import hosts as hostlib
from hvdlite.runner import job
from hvdlite.runner.elastic_driver import ElasticDriver

SCONTROL_TIMEOUT_S = 30.0


class AllocationHosts:
    """The Slurm allocation's nodes as {node: tasks}, for the elastic driver's discovery."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        nodes = launchers.expand_nodelist(env.get("SLURM_JOB_NODELIST", ""))
        counts = launchers.expand_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""))
        if not nodes or len(counts) != len(nodes):
            raise launchers.LauncherEnvError(
                "hvdliterun --srun: no Slurm allocation to take hosts from (SLURM_JOB_NODELIST=%r, "
                "SLURM_TASKS_PER_NODE=%r); run it inside sbatch/salloc, or give -H"
                % (env.get("SLURM_JOB_NODELIST"), env.get("SLURM_TASKS_PER_NODE"))
            )
        self._hosts = dict(zip(nodes, counts))

    def find(self):
        return dict(self._hosts)


def node_address(node):
    """The NodeAddr Slurm has for `node` (its name when scontrol does not say)."""
    out = subprocess.run(
        ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S
    ).stdout
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.partition("=")[2]
    return node


class SrunElasticDriver(ElasticDriver):
    """ElasticDriver whose workers are one-task srun steps (module doc)."""

    def is_local(self, host):
        return False  # a worker always runs through srun, wherever its node is

    def _store_host(self, found):
        if self.network_interfaces:
            return hostlib.store_address(list(found), self.network_interfaces)
        return hostlib.route_address(node_address(next(iter(found))))

    def _launch(self, w, env):
        argv = ["srun", "--nodes=1", "--ntasks=1", "--nodelist=" + w.host, "--kill-on-bad-exit=0"]
        if self.base_env.get("SLURM_JOB_ID"):
            argv.append("--exact")  # a step of the allocation, beside the other workers' steps
        return argv + self.command, env, None

    def _signal(self, w, signum):
        super()._signal(w, signal.SIGTERM if signum == signal.SIGKILL else signum)

    def _describe_exit(self, w, code):
        return "(its srun step) " + job.describe_remote_exit(code)
