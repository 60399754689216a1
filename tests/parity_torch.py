"""Shared by the test_parity_torch*.py files: horovod.torch's public names, the @covers
registry that maps each name to the Test class covering it, and the 2-rank job that runs
every class's ``on_rank(hvd)`` part of one test module (the same calls on every rank).

A class may also define ``before_init(hvd)``, run before init(); the job's result per rank
is a dict: class name -> on_rank's value, plus "before_init", "after_shutdown", "rank"."""

import importlib
import json
import os

import pytest
import torch
from helpers import run_pooled
from parity_registry import CoverageRegistry, err
from torch_wire import from_wire, to_wire

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "horovod_0.28.1_api.json")
with open(DATA) as _f:
    HOROVOD_TORCH_NAMES = json.load(_f)["modules"]["horovod.torch"]

_REGISTRY = CoverageRegistry(("on_rank", "before_init"))
COVERED = _REGISTRY.covered  # horovod.torch name -> the Test class covering it
RANK_PARTS = _REGISTRY.rank_parts  # classes with a part run on the ranks, in definition order
covers = _REGISTRY.covers


def rank_main(module_name):
    """One rank of the job of test module `module_name`."""
    import hvdlite.torch as hvd

    importlib.import_module(module_name)
    parts = [cls for cls in RANK_PARTS if cls.__module__ == module_name]
    torch.set_num_threads(1)
    before_init = {cls.__name__: cls.before_init(hvd) for cls in parts if hasattr(cls, "before_init")}
    hvd.init()
    out = {"before_init": before_init, "rank": hvd.rank(), "size": hvd.size()}
    for cls in parts:
        if hasattr(cls, "on_rank"):
            out[cls.__name__] = cls.on_rank(hvd)
            hvd.barrier()
    hvd.shutdown()
    out["after_shutdown"] = {"is_initialized": hvd.is_initialized(), "rank": err(hvd.rank)}
    return to_wire(out)


def job_fixture(module_name):
    """A module-scoped fixture: the per-rank results of `module_name`'s job on 2 ranks."""

    @pytest.fixture(scope="module")
    def job():
        return from_wire(run_pooled(rank_main, 2, args=(module_name,), timeout=240))

    return job


def by_rank(job, cls):
    return [r[cls.__name__] for r in job]
