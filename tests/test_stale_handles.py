"""Handles across shutdown()/init(): a handle of an earlier session never waits on or
consumes an operation of the new one (the core restarts its handle numbers at init)."""

import numpy as np
from helpers import run_ranks


def _numpy_stale_handle():
    import hvdlite as hvd

    hvd.init()
    h = hvd.allreduce_async(np.ones(3), op=hvd.Sum, name="old")
    hvd.shutdown()
    hvd.init()
    h2 = hvd.allreduce_async(np.full(3, 7.0), op=hvd.Sum, name="new")
    errors = []
    for call in (hvd.poll, hvd.synchronize):
        try:
            call(h)
        except hvd.InvalidArgumentError as e:
            errors.append(str(e))
    result = hvd.synchronize(h2).tolist()
    hvd.shutdown()
    return errors, result


def _torch_stale_handle():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="old")
    hvd.shutdown()
    hvd.init()
    h2 = hvd.allreduce_async(torch.full((3,), 7.0), op=hvd.Sum, name="new")
    errors = []
    try:
        hvd.synchronize(h)
    except hvd.InvalidArgumentError as e:
        errors.append(str(e))
    result = hvd.synchronize(h2).tolist()
    hvd.shutdown()
    return errors, result


def test_numpy_handle_from_an_earlier_session_is_rejected():
    for errors, result in run_ranks(_numpy_stale_handle, 2, timeout=60):
        assert len(errors) == 2, errors
        assert all("handle 1 " in e and "shutdown" in e for e in errors), errors
        assert result == [14.0, 14.0, 14.0]


def test_torch_handle_from_an_earlier_session_is_rejected():
    for errors, result in run_ranks(_torch_stale_handle, 2, timeout=60):
        assert len(errors) == 1 and "handle 1 " in errors[0], errors
        assert result == [14.0, 14.0, 14.0]
