"""hvdlite on Ray, with Horovod 0.28.1's horovod.ray API and module layout: RayExecutor
(runner.py; static, or elastic with min_workers), ElasticRayExecutor (elastic.py), the worker
actor class BaseHorovodWorker (worker.py), the placement strategies (strategy.py), the elastic
adapter (elastic_v2.py, the code in elastic.py), ray_logger.log for the executors' `callbacks`
(ray_logger.py, callbacks.py), and a Ray Train backend (train.py). Needs ray
(`pip install hvdlite[ray]`) and ray.init() done by the caller; docs/launchers.md, "Ray".
"""

from hvdlite.ray.elastic import ElasticAdapter, ElasticRayExecutor, RayHostDiscovery
from hvdlite.ray.runner import RayExecutor
from hvdlite.ray.worker import BaseHorovodWorker

__all__ = ["BaseHorovodWorker", "ElasticAdapter", "ElasticRayExecutor", "RayExecutor", "RayHostDiscovery"]
