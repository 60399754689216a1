"""Horovod's horovod.runner.common.util package (env, secret)."""
