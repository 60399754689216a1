"""Horovod's horovod.runner.common.service package (compute_service)."""
