"""Horovod's horovod.runner.common.service.compute_service: hvdlite's compute service
(hvdlite/runner/compute_service.py), which horovod.tensorflow.data coordinates through."""

from hvdlite.runner.compute_service import ComputeClient, ComputeService

__all__ = ["ComputeClient", "ComputeService"]
