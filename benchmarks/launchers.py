"""Start-up cost per launcher, side by side with hvdliterun: 2 ranks on this machine.

    python benchmarks/launchers.py [--reps 5] [--slurm] [--ray] [--spark]   # --slurm: root

Runs tests/launched_allreduce.py (hvd.init(), one allreduce, shutdown; nothing launcher-specific)
under each launcher in turn, the launchers alternating within every repetition so drift on a
shared machine falls on all of them alike. Per launcher: the median wall time from starting the
launcher to its exit, and the median of hvd.init()'s own duration (the slowest rank's; from the
script's start, so it includes the launcher's work inside init(): detection, the store, the
agent-store exchange under torchrun). --slurm also builds tests/simslurm.py's cluster (2
simulated hosts) and times `srun -N1 -n2`; --ray and --spark start a local Ray (2 CPUs) and a
Spark local-cluster[2,1,1024] once, before the repetitions, and time a job in them (RayExecutor
start + run + shutdown with 2 actors; ElasticRayExecutor's run with 2 actors, its elastic driver
and stores included; a Ray Train v2 DataParallelTrainer fit with hvdlite's backend and 2 workers;
hvdlite.spark.run with 2 tasks): the engine's own start-up is not in their numbers, and hvd.init()
there is timed from the call itself. Prints a markdown table of medians with their spread
(min-max over the repetitions) and the ratio of medians to hvdliterun's; asserts nothing about
time.
"""

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_launchers_run import SCRIPT, clean_env, results  # noqa: E402

PY = sys.executable
BIN = os.path.dirname(PY)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv, env):
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    found = results(proc.stdout)
    if proc.returncode != 0 or len(found) != 2:
        raise RuntimeError("%s failed (%d):\n%s%s" % (argv[0], proc.returncode, proc.stdout, proc.stderr))
    return wall, max(r["init_s"] for r in found.values())


def _torch_env(env):
    """Two processes given torch's variables by hand (Kubeflow PyTorchJob's pods)."""
    port = _free_port()
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [PY, SCRIPT],
            env=dict(env, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    wall = time.monotonic() - t0
    found = results(outs[0][0] + outs[1][0])
    if len(found) != 2:
        raise RuntimeError("torch-env failed: %s" % (outs,))
    return wall, max(r["init_s"] for r in found.values())


def launchers(slurm=None):
    env = clean_env(HVDLITE_SECRET="ab" * 32)
    out = {
        "hvdliterun": lambda: _run([PY, "-m", "hvdlite.runner.launch", "-np", "2", PY, SCRIPT], clean_env()),
        "torchrun": lambda: _run(
            [os.path.join(BIN, "torchrun"), "--nnodes", "1", "--nproc-per-node", "2", SCRIPT], clean_env()
        ),
        "torch variables (no agent)": lambda: _torch_env(env),
    }
    mpirun = shutil.which("mpirun")
    if mpirun:
        mpi_env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        out["mpirun"] = lambda: _run(
            [mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none", PY, SCRIPT], mpi_env
        )
    if slurm is not None:
        out["srun -N1 -n2"] = lambda: _run(["srun", "-N1", "-n2", PY, SCRIPT], slurm.env(env))
    return out


def measure(reps, slurm=None, extra=None):
    runs = launchers(slurm)
    runs.update(extra or {})
    samples = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            samples[name].append(run())
    return samples


def _engine_rank():
    """One rank under Ray or Spark: hvd.init()'s duration after one allreduce."""
    import numpy as np

    import hvdlite as hvd

    t0 = time.monotonic()
    hvd.init()
    init_s = time.monotonic() - t0
    hvd.allreduce(np.array([1.0]), name="bench")
    hvd.shutdown()
    return init_s


def _timed(job):
    t0 = time.monotonic()
    inits = job()
    return time.monotonic() - t0, max(inits)


def _ray_run():
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    executor.start()
    try:
        return executor.run(_engine_rank)
    finally:
        executor.shutdown()


def _elastic_ray_run():
    from hvdlite.ray import ElasticRayExecutor

    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    return executor.run(_engine_rank)


def _ray_train_rank(config):
    import json

    init_s = _engine_rank()
    with open(config["out"] % os.environ["HVDLITE_RANK"], "w") as f:
        json.dump(init_s, f)


def _ray_train_run():
    """Ray Train v2's DataParallelTrainer with hvdlite's backend, 2 workers (storage in a
    temporary directory; each rank writes its init time to a file there)."""
    import json

    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from hvdlite.ray.train import HvdliteConfig

    with tempfile.TemporaryDirectory(prefix="hvdlite-raytrain-") as d:
        out = os.path.join(d, "init-%s.json")
        DataParallelTrainer(
            _ray_train_rank,
            train_loop_config={"out": out},
            backend_config=HvdliteConfig(),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=d, name="bench"),
        ).fit()
        inits = []
        for r in range(2):
            with open(out % r) as f:
                inits.append(json.load(f))
        return inits


@contextlib.contextmanager
def engines(use_ray, use_spark):
    """{name: run} of the engines asked for, each started once (their own start-up is not timed:
    a Ray cluster or a Spark session is there before a job is)."""
    out, stops = {}, []
    try:
        if use_ray:
            import ray

            env = {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
            ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env})
            stops.append(ray.shutdown)
            out["RayExecutor (2 actors)"] = lambda: _timed(_ray_run)
            out["ElasticRayExecutor (2 actors)"] = lambda: _timed(_elastic_ray_run)
            out["Ray Train, HvdliteConfig (2 workers)"] = lambda: _timed(_ray_train_run)
        if use_spark:
            from pyspark.sql import SparkSession

            import hvdlite.spark

            os.environ["PYSPARK_PYTHON"] = PY
            session = (
                SparkSession.builder.master("local-cluster[2,1,1024]")
                .config("spark.executorEnv.PYTHONPATH", ROOT)
                .config("spark.ui.enabled", "false")
                .getOrCreate()
            )
            stops.append(session.stop)
            out["hvdlite.spark.run (2 executors)"] = lambda: _timed(
                lambda: hvdlite.spark.run(_engine_rank, num_proc=2, env={"OMP_NUM_THREADS": "1"})
            )
        yield out
    finally:
        for stop in reversed(stops):
            stop()


def table(samples):
    """Medians with their spread (min-max over the repetitions); the ratio is of medians."""
    base = statistics.median(w for w, _ in samples["hvdliterun"])
    rows = [
        "| launcher | wall, launch to exit: median [min-max] | hvd.init(): median [min-max] | wall / hvdliterun's |",
        "|---|---|---|---|",
    ]
    for name, got in samples.items():
        walls, inits = [w for w, _ in got], [i for _, i in got]
        wall = statistics.median(walls)
        rows.append(
            "| %s | %.2f s [%.2f-%.2f] | %.3f s [%.3f-%.3f] | %.2f |"
            % (
                name,
                wall,
                min(walls),
                max(walls),
                statistics.median(inits),
                min(inits),
                max(inits),
                wall / base,
            )
        )
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--slurm", action="store_true", help="also srun on a simulated Slurm cluster (root)")
    parser.add_argument("--ray", action="store_true", help="also RayExecutor on a local Ray (pip: ray)")
    parser.add_argument(
        "--spark", action="store_true", help="also hvdlite.spark.run on local-cluster (pyspark)"
    )
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    with engines(args.ray, args.spark) as extra:
        if not args.slurm:
            print(table(measure(reps, None, extra)))
            return
        from simhosts import SimCluster
        from simslurm import SimSlurm

        work = tempfile.mkdtemp(prefix="hvdlite-launchers-")
        try:
            os.makedirs(os.path.join(work, "hosts"))
            with (
                SimCluster(os.path.join(work, "hosts"), 2) as cluster,
                SimSlurm(cluster, os.path.join(work, "slurm")) as sim,
            ):
                print(table(measure(reps, sim, extra)))
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
