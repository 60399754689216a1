"""Asynchronous, atomic ZeRO checkpoints (hvd.save_checkpoint(blocking=False), hvd.wait_checkpoint,
hvdlite/torch/parallel/zero/checkpoint_io.py): the checkpoint holds the state of the moment
save_checkpoint returned although training changed the model during the write; a failed write
surfaces at wait_checkpoint on every rank, naming the rank that failed; a rank SIGKILLed in the
middle of its background write leaves the previous checkpoint loadable and the partial one ignored.

A slow or failing disk is simulated inside the ranks by wrapping checkpoint_io._write_file (the
function every file goes through); the files, threads and processes are real."""

import json
import os
import signal

import numpy as np
import pytest
import torch
import zero_cases as zc
from helpers import run_pooled, spawn_ranks


def _np(sd):
    return {k: v.detach().numpy().copy() for k, v in sd.items()}


def _equal(a, b):
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _fresh(hvd, stage):
    torch.manual_seed(123)  # a different initialization: everything must come from the file
    model = zc.Net()
    return model, hvd.ZeroOptimizer(zc.make_optimizer("adamw", model), model, stage=stage)


def _load_and_continue(hvd, path, stage):
    """A fresh model and optimizer load `path`; returns their full state as loaded and after
    steps 2-3 (what the saved job's steps 2-3 must equal)."""
    model, opt = _fresh(hvd, stage)
    hvd.load_checkpoint(path, model, opt)
    loaded = _np(hvd.full_state_dict(model))
    zc.train_steps(hvd, model, opt, 2, 2)
    return loaded, _np(hvd.full_state_dict(model))


def _slow_writes(checkpoint_io, seconds):
    """Wraps the writer's file function to sleep first; returns the original to restore."""
    import time

    real = checkpoint_io._write_file

    def slow(final, payload):
        time.sleep(seconds)
        real(final, payload)

    checkpoint_io._write_file = slow
    return real


def _snapshot(path):
    import hvdlite.torch as hvd
    from hvdlite.torch.parallel.zero import checkpoint_io

    hvd.init()
    model = zc.make_model()
    opt = hvd.ZeroOptimizer(zc.make_optimizer("adamw", model), model, stage=3)
    zc.train_steps(hvd, model, opt, 0, 2)
    hvd.save_checkpoint(path, model, opt, blocking=False)  # an older checkpoint, replaced below
    at_save = _np(hvd.full_state_dict(model))
    real = _slow_writes(checkpoint_io, 0.3)
    try:
        hvd.save_checkpoint(path, model, opt, blocking=False)  # joins the first save
        was_pending = checkpoint_io._PENDING is not None and checkpoint_io._PENDING.thread.is_alive()
        zc.train_steps(hvd, model, opt, 2, 2)  # changes the masters in place while the writer sleeps
        hvd.wait_checkpoint()
    finally:
        checkpoint_io._write_file = real
    hvd.wait_checkpoint()  # nothing pending: returns at once
    after = _np(hvd.full_state_dict(model))
    loaded, continued = _load_and_continue(hvd, path, stage=1)
    hvd.shutdown()
    return was_pending, at_save, after, loaded, continued


def test_async_save_holds_the_snapshot_and_loads(tmp_path):
    path = str(tmp_path / "ckpt")
    results = run_pooled(_snapshot, 2, args=(path,), timeout=90)
    for was_pending, at_save, after, loaded, continued in results:
        assert was_pending  # save_checkpoint returned before the write
        assert not _equal(at_save, after)  # training did change the model during the write
        assert _equal(loaded, at_save)
        assert (
            zc.max_rel_diff(
                {k: torch.from_numpy(v) for k, v in continued.items()},
                {k: torch.from_numpy(v) for k, v in after.items()},
            )
            <= 1e-6
        )
    with open(os.path.join(path, "meta.json")) as f:
        data = json.load(f)["data"]
    assert sorted(os.listdir(path)) == [data, "meta.json"]  # the first save's folder is gone
    assert sorted(os.listdir(os.path.join(path, data))) == [
        "rest.pt",
        "shard-00000-of-00002.pt",
        "shard-00001-of-00002.pt",
    ]


def _write_errors(root):
    import hvdlite.torch as hvd
    from hvdlite.common.exceptions import HvdliteError
    from hvdlite.torch.parallel.zero import checkpoint_io

    hvd.init()
    model = zc.make_model()
    opt = hvd.ZeroOptimizer(zc.make_optimizer("adamw", model), model, stage=2)
    zc.train_steps(hvd, model, opt, 0, 1)
    errors = []
    blocker = os.path.join(root, "a-file")  # a path below a regular file cannot be a folder
    hvd.save_checkpoint(os.path.join(blocker, "ckpt"), model, opt, blocking=False)  # returns
    with pytest.raises(HvdliteError) as err:
        hvd.wait_checkpoint()
    errors.append(str(err.value))
    good = os.path.join(root, "ckpt")
    hvd.save_checkpoint(good, model, opt)  # a failed save leaves the process able to save
    saved = _np(hvd.full_state_dict(model))
    with open(os.path.join(good, "meta.json")) as f:
        folder = os.path.join(good, json.load(f)["data"])
    mine = torch.load(checkpoint_io.shard_file(folder, hvd.rank(), 2), weights_only=True)
    # stage 2's fp32 master shard views the flat bucket: the file holds the shard's bytes only
    compact = all(m.untyped_storage().nbytes() == m.numel() * 4 for m in mine["master"])
    zc.train_steps(hvd, model, opt, 1, 1)
    real = checkpoint_io._write_file
    if hvd.rank() == 1:

        def full_disk(final, payload):
            raise OSError(28, "No space left on device (simulated)", final)

        checkpoint_io._write_file = full_disk
    try:
        hvd.save_checkpoint(good, model, opt, blocking=False)
        with pytest.raises(HvdliteError) as err:
            hvd.wait_checkpoint()
        errors.append(str(err.value))
    finally:
        checkpoint_io._write_file = real
    model2, opt2 = _fresh(hvd, stage=2)
    hvd.load_checkpoint(good, model2, opt2)  # the previous checkpoint, untouched
    loaded = _np(hvd.full_state_dict(model2))
    hvd.shutdown()
    return errors, _equal(loaded, saved), compact


def test_write_errors_surface_at_wait_and_leave_the_previous_checkpoint(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    results = run_pooled(_write_errors, 2, args=(str(tmp_path),), timeout=90)
    for errors, intact, compact in results:
        assert "a-file" in errors[0] and "NotADirectoryError" in errors[0], errors[0]
        assert intact and compact
    assert "rank 1 failed to write its part" in results[0][0][1], results[0][0][1]  # via error-1
    assert "No space left on device" in results[0][0][1]
    assert "failed on rank 1" in results[1][0][1], results[1][0][1]


def _killed_mid_write(path):
    import hvdlite.torch as hvd
    from hvdlite.common.exceptions import HvdliteError
    from hvdlite.torch.parallel.zero import checkpoint_io

    hvd.init()
    model = zc.make_model()
    opt = hvd.ZeroOptimizer(zc.make_optimizer("adamw", model), model, stage=2)
    zc.train_steps(hvd, model, opt, 0, 2)
    hvd.save_checkpoint(path, model, opt)
    saved = _np(hvd.full_state_dict(model))
    zc.train_steps(hvd, model, opt, 2, 2)
    if hvd.rank() == 1:

        def killed(final, payload):  # half the file on disk, then the process is gone
            with open(final + ".tmp", "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        checkpoint_io._write_file = killed
    hvd.save_checkpoint(path, model, opt, blocking=False)
    if hvd.rank() == 1:
        checkpoint_io._PENDING.thread.join(30)  # SIGKILLed in there
        return None
    with pytest.raises(HvdliteError) as err:
        hvd.wait_checkpoint()  # rank 1's shard never arrives: the bound ends the wait
    return saved, str(err.value)


@pytest.mark.slow
def test_rank_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    import hvdlite.torch as hvd

    path = str(tmp_path / "ckpt")
    env = {"HVDLITE_CHECKPOINT_COMMIT_SECONDS": "2"}
    results = spawn_ranks(_killed_mid_write, 2, args=(path,), timeout=90, env=env)
    assert results[1].exitcode == -signal.SIGKILL, results[1]
    assert results[0].traceback is None, results[0].traceback
    saved, error = results[0].value
    assert "ranks [1] did not write shard-00001-of-00002.pt" in error, error
    with open(os.path.join(path, "meta.json")) as f:
        committed = json.load(f)["data"]
    partial = [n for n in os.listdir(path) if n.startswith("data-") and n != committed]
    assert len(partial) == 1, os.listdir(path)  # the killed save's folder, never committed
    assert "shard-00001-of-00002.pt.tmp" in os.listdir(os.path.join(path, partial[0]))
    consolidated = _np(hvd.consolidate_checkpoint(path))  # in this process: no job at all
    assert _equal(consolidated, saved)
    model = zc.Net()
    hvd.load_checkpoint(path, model)
    assert _equal(_np(model.state_dict()), saved)


def _plain_data_parallel(path):
    """A model without ZeRO (hvd.DistributedOptimizer): rank 0 writes it whole, asynchronously;
    a ZeroOptimizer job loads it and trains on as the data-parallel job did."""
    import hvdlite.torch as hvd
    from hvdlite.torch.parallel.zero import checkpoint_io

    hvd.init()
    model = zc.make_model()
    opt = hvd.DistributedOptimizer(
        zc.make_optimizer("adamw", model), named_parameters=model.named_parameters()
    )
    zc.train_steps(hvd, model, opt, 0, 2)
    at_save = _np(model.state_dict())
    real = _slow_writes(checkpoint_io, 0.3)
    try:
        hvd.save_checkpoint(path, model, opt, blocking=False)
        zc.train_steps(hvd, model, opt, 2, 2)  # during rank 0's write
        hvd.wait_checkpoint()
    finally:
        checkpoint_io._write_file = real
    hvd.barrier()  # rank 0 has committed
    final = _np(model.state_dict())
    loaded, continued = _load_and_continue(hvd, path, stage=2)
    hvd.shutdown()
    return at_save, final, loaded, continued


def test_plain_model_async_save_loads_into_zero_and_one_process(tmp_path):
    import hvdlite.torch as hvd

    path = str(tmp_path / "ckpt")
    results = run_pooled(_plain_data_parallel, 2, args=(path,), timeout=90)
    at_save, final, _, _ = results[0]
    for _, _, loaded, continued in results:
        assert _equal(loaded, at_save)
        rel = zc.max_rel_diff(
            {k: torch.from_numpy(v) for k, v in continued.items()},
            {k: torch.from_numpy(v) for k, v in final.items()},
        )
        assert rel <= 1e-6, rel
    with open(os.path.join(path, "meta.json")) as f:
        data = json.load(f)["data"]
    assert sorted(os.listdir(os.path.join(path, data))) == ["rest.pt", "shard-00000-of-00001.pt"]
    model = zc.Net()  # one process, no job: a plain AdamW takes the saved state whole
    opt = zc.make_optimizer("adamw", model)
    hvd.load_checkpoint(path, model, opt)
    assert _equal(_np(model.state_dict()), at_save)
    for step in range(2, 4):
        x, y = zc.batch(step)
        zc.loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
    rel = zc.max_rel_diff(
        {k: v.detach() for k, v in model.state_dict().items()},
        {k: torch.from_numpy(v) for k, v in final.items()},
    )
    assert rel <= 1e-6, rel
    hvd.save_checkpoint(path, model, opt)  # no job: this process writes it, blocking
    assert _equal(_np(hvd.consolidate_checkpoint(path)), _np(model.state_dict()))


def test_a_checkpoint_of_the_earlier_layout_loads_and_a_save_replaces_it(tmp_path):
    """Files beside meta.json (no "data" key): as written before data-<id>/ existed."""
    import hvdlite.torch as hvd

    path = str(tmp_path / "ckpt")
    model = zc.make_model()
    hvd.save_checkpoint(path, model)  # no job, no optimizer: this process writes the parameters
    meta_file = os.path.join(path, "meta.json")
    with open(meta_file) as f:
        meta = json.load(f)
    folder = os.path.join(path, meta.pop("data"))
    for name in os.listdir(folder):
        os.replace(os.path.join(folder, name), os.path.join(path, name))
    os.rmdir(folder)
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"not ours")
    other = zc.Net()
    hvd.load_checkpoint(path, other)
    assert _equal(_np(other.state_dict()), _np(model.state_dict()))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    hvd.save_checkpoint(path, model, blocking=False)
    hvd.wait_checkpoint()
    with open(meta_file) as f:
        data = json.load(f)["data"]
    assert sorted(os.listdir(path)) == [data, "meta.json", "model.pt"]  # the old files are gone
    hvd.load_checkpoint(path, other)
    assert _equal(_np(other.state_dict()), _np(model.state_dict()))
