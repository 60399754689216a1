"""Horovod's module horovod.ray.elastic_v2 (the elastic form of RayExecutor: ElasticAdapter, which
RayExecutor(min_workers=...) delegates to, and RayHostDiscovery), for code that imports it by
that name through the compat package; the code is in hvdlite/ray/elastic.py."""

from hvdlite.ray.elastic import ElasticAdapter, RayHostDiscovery

__all__ = ["ElasticAdapter", "RayHostDiscovery"]
