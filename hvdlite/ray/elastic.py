"""Elastic hvdlite on Ray: ElasticRayExecutor (Horovod 0.28.1's horovod.ray.ElasticRayExecutor)
and the elastic form of RayExecutor (min_workers/max_workers: Horovod's horovod.ray.elastic_v2
ElasticAdapter). Needs ray and ray.init() done by the caller.

hvdlite's elastic driver (hvdlite/runner/elastic_driver.py) runs in the caller's process with its
policy unchanged: generations, survivors first, blacklisting a failed worker's host (with the
cooldown range), min/max workers, the elastic timeout and the reset limit. Only two things differ
from hvdliterun's elastic mode, and they live here:
  - hosts are the alive Ray nodes, named by Ray node id (raylets may share an address), with
    slots = CPU // cpus_per_slot (and at most GPU // gpus_per_slot with use_gpu), read from
    ray.nodes() every second (RayHostDiscovery), so nodes that join or leave the Ray cluster
    join or leave the job; a discovery of the caller's (settings.discovery with
    override_discovery=False) may be written for Horovod (find_available_hosts_and_slots) and
    name hosts by node address, as Horovod does;
  - a worker is one Ray actor pinned to its node (NodeAffinitySchedulingStrategy, hard) that
    takes the worker's environment and calls the function. Its exit status, as the driver sees
    it: 0 when the function returned or the worker left the job (the SystemExit(0) of
    hvdlite/elastic/worker.py), 1 when the function raised or the actor died (its node was
    removed, or it was killed). An ended worker's actor is killed at once.
The stores listen on the driver's Ray node address, which every Ray node reaches.

run() (and the elastic RayExecutor's execute()) blocks until the job ends and returns the return
values of the last generation's workers in rank order; a failed job raises HvdliteError with the
driver's message (Horovod raises RuntimeError, its base class). `callbacks`: every value a worker
of any generation passes to hvdlite.ray.ray_logger.log is passed to every callback in the driver
while the job runs (hvdlite/ray/callbacks.py), as in Horovod. The elastic RayExecutor creates its
start() executable class in every worker of every generation (after the worker's environment is
set, so its constructor may call hvd.init()) and execute(fn) calls fn(executable); run_remote and
execute_single are refused as in Horovod (the workers are ephemeral).
"""

import dataclasses
import re
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from hvdlite.common import exceptions
from hvdlite.ray.callbacks import CallbackQueue
from hvdlite.runner import elastic_discovery
from hvdlite.runner.elastic_driver import ElasticDriver


@dataclasses.dataclass
class ElasticSettings:
    """ElasticRayExecutor's settings; mutable, as Horovod's (Horovod's examples set
    `settings.discovery` and pass override_discovery=False)."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600
    timeout_s: int = 30
    cooldown_range: Any = None
    discovery: Any = None
    verbose: bool = False


class RayHostDiscovery:
    """The alive Ray nodes as elastic hosts (module doc). Called from the driver's discovery
    thread; ray.nodes() does not block on the cluster's workers."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: int = 1, gpus_per_slot: int = 1) -> None:
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot

    def find(self) -> dict[str, int]:
        """What the elastic driver calls: Horovod's method, so a subclass that overrides
        find_available_hosts_and_slots (as Horovod's examples do) is what the driver sees."""
        return self.find_available_hosts_and_slots()

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """{Ray node id: slots} of the alive nodes with at least one slot (class doc)."""
        import ray

        hosts = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            slots = int(resources.get("CPU", 0) // self.cpus_per_slot)
            if self.use_gpu:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_slot))
            if slots > 0:
                hosts[node["NodeID"]] = slots
        return hosts


class HorovodDiscovery:
    """A discovery object written for Horovod (a horovod.runner.elastic.discovery.HostDiscovery:
    only find_available_hosts_and_slots() -> {host: slots}) as the elastic driver's discovery
    (its find()). Its hosts may be Ray node ids or node addresses (Horovod's names; _placement)."""

    def __init__(self, discovery: Any) -> None:
        self.discovery = discovery

    def find(self) -> dict[str, int]:
        return dict(self.discovery.find_available_hosts_and_slots())


def _as_driver_discovery(discovery: Any) -> Any:
    """discovery itself when it has find(), else HorovodDiscovery around it."""
    return discovery if hasattr(discovery, "find") else HorovodDiscovery(discovery)


def _placement(host: str, resources: dict[str, Any]) -> dict[str, Any]:
    """Ray actor options that put a worker on `host`: a Ray node id (RayHostDiscovery's names)
    pins it there (hard NodeAffinitySchedulingStrategy); any other name is taken as a node
    address, as Horovod names hosts, and asks for a sliver of Ray's `node:<address>` resource."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if re.fullmatch(r"[0-9a-f]{56}", host):
        return dict(resources, scheduling_strategy=NodeAffinitySchedulingStrategy(host, soft=False))
    return dict(resources, resources={"node:%s" % host: 0.001})


class _ElasticWorker:
    """The actor of one elastic worker (made a Ray actor class by _RayElasticDriver)."""

    def run(
        self, env: dict[str, str], fn: Callable[[Any], Any], executable: Any, queue: Any
    ) -> tuple[int, Any]:
        """Sets env and the callback queue, creates the executable (cls, args, kwargs) if any, and
        calls fn(executable or None): (0, its value), (SystemExit's status, None) or (1, the
        traceback)."""
        import os

        from hvdlite.ray import ray_logger

        os.environ.update(env)
        ray_logger.configure(queue)
        try:
            instance = None
            if executable is not None:
                cls, args, kwargs = executable
                instance = cls(*(args or ()), **(kwargs or {}))
            return 0, fn(instance)
        except SystemExit as e:
            return (e.code if isinstance(e.code, int) else int(e.code is not None)), None
        except BaseException:  # the driver reports it; the actor itself must not die of it
            return 1, traceback.format_exc()


class _ActorRun:
    """A running worker as the driver's w.proc: wait() returns its exit status (module doc)."""

    def __init__(self, actor: Any, ref: Any) -> None:
        self.actor, self.ref = actor, ref
        self.value: Any = None
        self.reason = ""

    def wait(self) -> int:
        import ray

        try:
            code, self.value = ray.get(self.ref)
            code = int(code)
            if code:
                self.reason = "raised:\n%s" % self.value if isinstance(self.value, str) else ""
        except ray.exceptions.RayError as e:
            code, self.reason = (
                1,
                "lost its Ray actor (%s: its node removed or the actor killed)" % (type(e).__name__),
            )
        self.kill()
        return code

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except ValueError:
            pass  # already gone


class _RayElasticDriver(ElasticDriver):
    """ElasticDriver whose workers are Ray actors on Ray nodes (module doc)."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        resources: dict[str, Any],
        executable: Any = None,
        queue: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(command=[], **kwargs)
        import ray

        self._fn, self._resources = fn, resources
        self._executable, self._queue = executable, queue
        self._actor_cls: Any = ray.remote(_ElasticWorker)
        self.messages: list[str] = []

    def log(self, msg: str) -> None:
        self.messages.append(msg)
        self._err.write(("hvdlite.ray: %s\n" % msg).encode())

    def _store_host(self, found: dict[str, int]) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def _reachable(self, found: dict[str, int]) -> dict[str, int]:
        return found  # every Ray node reaches the driver's node address

    def _spawn(self, w: Any, record: dict[str, Any]) -> None:
        import threading

        env = self._worker_env(w, record)
        actor: Any = self._actor_cls.options(**_placement(w.host, self._resources)).remote()
        w.proc = _ActorRun(actor, actor.run.remote(env, self._fn, self._executable, self._queue))
        threading.Thread(target=self._reap, args=(w,), daemon=True).start()

    def _signal(self, w: Any, signum: int) -> None:
        if w.proc is not None and w.alive:
            w.proc.kill()

    def _describe_exit(self, w: Any, code: int) -> str:
        return w.proc.reason or "exited with status %d" % code

    def results(self) -> list[Any]:
        """The return values of the last generation's workers, in rank order."""
        return [self.workers[i].proc.value for i in self.current]


def run_elastic(
    fn: Callable[[Any], Any],
    discovery: Any,
    min_workers: int,
    max_workers: int | None,
    resources: dict[str, Any],
    env_vars: dict[str, str] | None = None,
    reset_limit: int | None = None,
    cooldown_range: Any = None,
    elastic_timeout: float = 600.0,
    verbose: bool = False,
    executable: tuple[type, Any, Any] | None = None,
    callbacks: list[Callable[..., Any]] | None = None,
) -> list[Any]:
    """Runs fn(executable instance, or None) elastically on Ray actors, each callback called on
    every value the workers log (module doc); blocks until the job ends."""
    if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
        raise exceptions.InvalidArgumentError(
            "elastic Ray job: want 1 <= min_workers <= max_workers, got %s and %s"
            % (min_workers, max_workers)
        )
    hosts = elastic_discovery.HostManager(
        _as_driver_discovery(discovery), tuple(cooldown_range) if cooldown_range is not None else None
    )
    with CallbackQueue(callbacks) as calls:
        driver = _RayElasticDriver(
            fn,
            resources,
            executable,
            calls.queue,
            np=min_workers,
            min_np=min_workers,
            max_np=max_workers,
            hosts=hosts,
            elastic_timeout=elastic_timeout,
            reset_limit=reset_limit,
            base_env={k: str(v) for k, v in (env_vars or {}).items()},
            verbose=verbose,
        )
        code = driver.run()
    if code != 0:
        raise exceptions.HvdliteError(
            "elastic Ray job failed: %s" % (driver.messages[-1] if driver.messages else "see the log")
        )
    return driver.results()


def _resources(use_gpu: bool, cpus: int, gpus: int | None) -> dict[str, Any]:
    if gpus and not use_gpu:
        raise exceptions.InvalidArgumentError("gpus_per_slot is set, but use_gpu is False")
    return {"num_cpus": cpus, "num_gpus": (gpus or 1) if use_gpu else 0}


class ElasticRayExecutor:
    """Horovod's horovod.ray.ElasticRayExecutor over hvdlite's elastic driver (module doc)."""

    @staticmethod
    def create_settings(
        min_num_proc: int = 1,
        max_num_proc: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: int = 600,
        timeout_s: int = 30,
        ssh_identity_file: str | None = None,
        nics: Any = None,
        min_np: int | None = None,
        max_np: int | None = None,
        **kwargs: Any,
    ) -> ElasticSettings:
        """Horovod's settings (min_np/max_np: its deprecated spellings). ssh_identity_file and
        nics are accepted and unused (Ray starts the workers); of `**kwargs`, verbose and
        cooldown_range are read."""
        return ElasticSettings(
            min_np if min_np is not None else min_num_proc,
            max_np if max_np is not None else max_num_proc,
            reset_limit,
            elastic_timeout,
            timeout_s,
            kwargs.get("cooldown_range"),
            None,
            bool(kwargs.get("verbose", False)),
        )

    def __init__(
        self,
        settings: Any,
        use_gpu: bool = False,
        cpus_per_slot: int = 1,
        gpus_per_slot: int | None = None,
        env_vars: dict[str, str] | None = None,
        override_discovery: bool = True,
    ) -> None:
        self.resources = _resources(use_gpu, cpus_per_slot, gpus_per_slot)
        self.discovery = (
            RayHostDiscovery(use_gpu, cpus_per_slot, gpus_per_slot or 1)
            if override_discovery or getattr(settings, "discovery", None) is None
            else settings.discovery
        )
        self.settings = settings
        self.env_vars = dict(env_vars or {})

    def start(self) -> None:
        """Nothing to start before run(): the driver and its stores live for one run()."""

    def run(
        self, worker_fn: Callable[[], Any], callbacks: list[Callable[..., Any]] | None = None
    ) -> list[Any]:
        """worker_fn() on every worker, elastically; the last generation's values in rank order."""
        s = self.settings
        return run_elastic(
            lambda _: worker_fn(),
            self.discovery,
            getattr(s, "min_num_proc", 1),
            getattr(s, "max_num_proc", None),
            self.resources,
            self.env_vars,
            getattr(s, "reset_limit", None),
            getattr(s, "cooldown_range", None),
            getattr(s, "elastic_timeout", 600),
            getattr(s, "verbose", False),
            callbacks=callbacks,
        )


class ElasticAdapter:
    """The elastic form of RayExecutor (Horovod's horovod.ray.elastic_v2.ElasticAdapter):
    RayExecutor(settings, min_workers=..., max_workers=...) delegates to it."""

    def __init__(
        self,
        settings: Any,
        min_workers: int,
        max_workers: int | None = None,
        use_gpu: bool = False,
        cpus_per_worker: int = 1,
        gpus_per_worker: int | None = None,
        override_discovery: bool = True,
        reset_limit: int | None = None,
        cooldown_range: Any = None,
        elastic_timeout: int = 600,
    ) -> None:
        self.settings = settings
        self.resources = _resources(use_gpu, cpus_per_worker, gpus_per_worker)
        self.discovery = (
            RayHostDiscovery(use_gpu, cpus_per_worker, gpus_per_worker or 1)
            if override_discovery or getattr(settings, "discovery", None) is None
            else settings.discovery
        )
        self.min_workers, self.max_workers = min_workers, max_workers
        self.reset_limit, self.cooldown_range, self.elastic_timeout = (
            reset_limit,
            cooldown_range,
            elastic_timeout,
        )
        self.env_vars: dict[str, str] = {}
        self.executable: tuple[type, Any, Any] | None = None

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: list[Any] | None = None,
        executable_kwargs: dict[str, Any] | None = None,
        extra_env_vars: dict[str, str] | None = None,
    ) -> None:
        """Keeps extra_env_vars and the executable class for the workers: nothing runs before
        run()/execute(), and every worker of every generation creates its own
        `executable_cls(*executable_args, **executable_kwargs)` (module doc)."""
        self.executable = (
            (executable_cls, executable_args, executable_kwargs) if executable_cls is not None else None
        )
        self.env_vars = {k: str(v) for k, v in (extra_env_vars or {}).items()}

    def run(
        self,
        fn: Callable[..., Any],
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callbacks: list[Callable[..., Any]] | None = None,
    ) -> list[Any]:
        """`fn(*args, **kwargs)` on every worker, elastically; values in rank order."""
        a, kw = list(args or ()), dict(kwargs or {})
        return self.execute(lambda _: fn(*a, **kw), callbacks)

    def execute(
        self, fn: Callable[[Any], Any], callbacks: list[Callable[..., Any]] | None = None
    ) -> list[Any]:
        """fn(executable) on every worker, elastically (the executable of start(), created in
        each worker; None without one); values in rank order."""
        return run_elastic(
            fn,
            self.discovery,
            self.min_workers,
            self.max_workers,
            self.resources,
            self.env_vars,
            self.reset_limit,
            self.cooldown_range,
            self.elastic_timeout,
            bool(getattr(self.settings, "verbose", False)),
            self.executable,
            callbacks,
        )

    def run_remote(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused, as in Horovod: no ObjectRefs outlive an elastic run's workers."""
        raise exceptions.NotSupportedError(
            "elastic RayExecutor: ObjectRefs cannot be returned from Elastic runs as the workers "
            "are ephemeral; use run() (it returns the values)"
        )

    def execute_single(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused, as in Horovod: an elastic job has no fixed rank-0 worker between calls."""
        raise exceptions.NotSupportedError(
            "Elastic mode does not support execute_single. Please use the execute method instead"
        )

    def shutdown(self) -> None:
        """Nothing outlives run()."""
