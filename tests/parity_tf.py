"""Shared by the test_parity_tf*.py files: horovod.tensorflow's public names, the @covers
registry that maps each name to the Test class covering it, and the 2-rank job that runs
every class's ``on_rank(hvd, tf)`` part of one test module (the same calls on every rank).
Mirrors tests/parity_torch.py; on_rank returns plain Python values (lists, numbers, str)."""

import importlib
import json
import os

import pytest
from helpers import TF_SPAWN_ENV, run_pooled
from parity_registry import CoverageRegistry, err  # noqa: F401 -- err is used by the test modules

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "horovod_0.28.1_api.json")
with open(DATA) as _f:
    HOROVOD_TF_NAMES = json.load(_f)["modules"]["horovod.tensorflow"]

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}
_REGISTRY = CoverageRegistry(("on_rank",))
COVERED = _REGISTRY.covered  # horovod.tensorflow name -> the Test class covering it
RANK_PARTS = _REGISTRY.rank_parts  # classes with a part run on the ranks, in definition order
covers = _REGISTRY.covers


def rank_main(module_name):
    """One rank of the job of test module `module_name`."""
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    tf.get_logger().setLevel("ERROR")
    importlib.import_module(module_name)
    parts = [cls for cls in RANK_PARTS if cls.__module__ == module_name]
    hvd.init()
    out = {"rank": hvd.rank(), "size": hvd.size()}
    for cls in parts:
        out[cls.__name__] = cls.on_rank(hvd, tf)
        hvd.barrier()
    hvd.shutdown()
    return out


def job_fixture(module_name):
    """A module-scoped fixture: the per-rank results of `module_name`'s job on 2 ranks, under
    each Keras (the tests using it run twice)."""

    @pytest.fixture(scope="module")
    def job(keras_env):  # once per Keras (tests/conftest.py)
        return run_pooled(
            rank_main,
            2,
            args=(module_name,),
            timeout=240,
            env=TF_ENV,
            spawn_env=dict(TF_SPAWN_ENV, **keras_env),
        )

    return job


def by_rank(job, cls):
    return [r[cls.__name__] for r in job]
