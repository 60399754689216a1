"""Atomic, optionally asynchronous writes of checkpoint directories (checkpoint.py's format).

Layout of a checkpoint directory `path`:
  path/meta.json        the commit point, written last by the process set's first rank: a
                        fsynced temporary file renamed over meta.json (os.replace is atomic), so a
                        reader sees the previous checkpoint or the new one, never a mix
  path/data-<id>/       the files meta.json's "data" names; each written as <name>.tmp, fsynced,
                        then renamed, so a file under its final name is complete

One save (save_checkpoint):
  calling thread   joins the previous save of this process (and raises its error), agrees on
                   <id> with the set (one broadcast_object: every collective runs here), and,
                   for blocking=False, copies what this rank writes to host memory
  writer           (a background thread, or the calling thread when blocking) writes this
                   rank's files into data-<id>/; the set's first rank then waits until every
                   file meta.json names exists (bounded: HVDLITE_CHECKPOINT_COMMIT_SECONDS),
                   renames meta.json into place and removes every other data-* folder (older
                   checkpoints, partial ones of saves that crashed)
A crash (even SIGKILL) of any rank before meta.json's rename leaves the previous checkpoint
loadable; its partial folder is never read (loaders go through meta.json) and the next commit
removes it. A writer that fails leaves error-<rank> in data-<id>/, so the first rank gives up at
once, naming it, instead of waiting out the bound.

Threading: at most one pending save per process (_PENDING, guarded by _LOCK); the writer thread
runs no collective and reads only the host copies made before save_checkpoint returned. It is
not a daemon: an interpreter that exits with a save pending finishes it first.
"""

import json
import os
import re
import shutil
import threading
import time
import uuid

import torch

from hvdlite.common import basics, exceptions, objects, settings
from hvdlite.common.topology import rank as global_rank

FORMAT = "hvdlite-zero-1"  # meta.json's "format"
META = "meta.json"
_DATA_PREFIX = "data-"
_OLD_FLAT = re.compile(r"^(shard-\d+-of-\d+\.pt|rest\.pt)$")  # the format before data-<id>/
_LOCK = threading.Lock()
_PENDING = None  # the _Save in flight, or None


def shard_file(path, member, count, prefix="shard"):
    """The file of member `member` of `count` in checkpoint directory `path` (also the sharded
    embedding tables' checkpoints, hvdlite/torch/parallel/sparse/checkpoint.py)."""
    return os.path.join(path, "%s-%05d-of-%05d.pt" % (prefix, member, count))


def rest_and_keys(model, managed):
    """(state_dict entries outside `managed` ({id(param): name}), [(key, managed name or None)])."""
    rest, keys = {}, []
    for key, value in model.state_dict(keep_vars=True).items():
        name = managed.get(id(value))
        keys.append((key, name))
        if name is None:
            rest[key] = value.detach().clone()
    return rest, keys


def _rank():
    return global_rank() if basics.is_initialized() else 0


class _Save:
    """One rank's part of one save: the files it writes and, on the first rank, the commit."""

    def __init__(self, path, data, files, meta_text, expect):
        self.path, self.data, self.files = path, data, files
        self.meta_text, self.expect = meta_text, expect  # expect: {file name: rank writing it}
        self.error = None
        self.thread = None

    def run(self):
        try:
            folder = os.path.join(self.path, self.data)
            os.makedirs(folder, exist_ok=True)
            for name, payload in self.files.items():
                _write_file(os.path.join(folder, name), payload)
            self.files = None  # the host copies go as soon as they are on disk
            if self.meta_text is not None:
                _commit(self.path, self.data, self.meta_text, self.expect)
        except BaseException as err:  # kept for wait(), which raises it
            self.error = err
            self.files = None
            if self.meta_text is None:
                _leave_error_marker(os.path.join(self.path, self.data), err)


def _write_file(final, payload):
    """torch.save(payload) to `final` atomically: a fsynced temporary file, then a rename."""
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def _fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _leave_error_marker(folder, err):
    try:
        with open(os.path.join(folder, "error-%d" % _rank()), "w") as f:
            f.write("%s: %s" % (type(err).__name__, err))
    except OSError:
        pass  # the folder itself may be what failed; the first rank's bound still holds


def _wait_for_files(path, folder, expect):
    """Returns once every file of `expect` is in `folder`; raises on an error marker or when
    HVDLITE_CHECKPOINT_COMMIT_SECONDS pass first."""
    bound = settings.get("CHECKPOINT_COMMIT_SECONDS")
    deadline, pause = time.monotonic() + bound, 0.002
    while True:
        names = set(os.listdir(folder))
        failed = sorted(n for n in names if n.startswith("error-"))
        if failed:
            with open(os.path.join(folder, failed[0])) as f:
                raise exceptions.HvdliteError(
                    "checkpoint %s: rank %s failed to write its part (%s); the previous checkpoint"
                    " there stays" % (path, failed[0][len("error-") :], f.read())
                )
        missing = sorted(n for n in expect if n not in names)
        if not missing:
            return
        if time.monotonic() > deadline:
            ranks = sorted({expect[n] for n in missing})
            raise exceptions.HvdliteError(
                "checkpoint %s: ranks %s did not write %s within %g s (HVDLITE_CHECKPOINT_COMMIT_SECONDS):"
                " they died or their storage is slow; the previous checkpoint there stays"
                % (path, ranks, ", ".join(missing), bound)
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _commit(path, data, meta_text, expect):
    folder = os.path.join(path, data)
    _wait_for_files(path, folder, expect)
    _fsync_dir(folder)
    tmp = os.path.join(path, META + ".tmp-" + data)
    with open(tmp, "w") as f:
        f.write(meta_text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, META))
    _fsync_dir(path)
    for name in os.listdir(path):  # what no longer belongs to the committed checkpoint
        full = os.path.join(path, name)
        if name.startswith(_DATA_PREFIX) and name != data and os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)
        elif _OLD_FLAT.match(name) or name.startswith(META + ".tmp-"):
            os.remove(full)


def new_data_name(process_set):
    """The folder name of a new save, the same on every member. Collective over the set."""
    token = uuid.uuid4().hex[:12] if global_rank() == process_set.ranks[0] else None
    token = objects.broadcast_object(token, root_rank=process_set.ranks[0], process_set=process_set)
    return _DATA_PREFIX + token


def local_data_name():
    """The folder name of a save that one process writes alone (no agreement needed)."""
    return _DATA_PREFIX + uuid.uuid4().hex[:12]


def host_copy(obj):
    """A host-memory copy of the tensors in `obj` (dicts, lists, tuples, scalars), taken now:
    CUDA tensors go through pinned memory with one synchronize at the end."""
    return _copy(obj, always=True)


def compact(obj):
    """`obj` with every tensor that views part of a larger storage (a ZeRO master shard inside
    its flat bucket) copied, so that torch.save writes the tensor's bytes only, not the storage's."""
    return _copy(obj, always=False)


def _copy(obj, always):
    cuda = []

    def copy(x):
        if torch.is_tensor(x):
            x = x.detach()
            if not always and x.untyped_storage().nbytes() <= x.numel() * x.element_size():
                return x
            if x.is_cuda and always:
                out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
                out.copy_(x, non_blocking=True)
                cuda.append(x.device)
                return out
            return x.clone()
        if isinstance(x, dict):
            return {k: copy(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v) for v in x)
        return x

    out = copy(obj)
    for device in set(cuda):
        torch.cuda.synchronize(device)
    return out


def start(path, data, files, meta, expect, blocking):
    """Writes `files` ({name: payload}) into path/data; with `meta` (first rank only), commits
    once every file of `expect` ({name: rank}) is there. blocking: in this thread, raising any
    error; otherwise in a writer thread that wait() joins. The caller has joined the previous
    save (wait()) and, for blocking=False, made the payloads host copies."""
    global _PENDING
    meta_text = None if meta is None else json.dumps(dict(meta, data=data), indent=1, default=str)
    job = _Save(path, data, files, meta_text, expect)
    if blocking:
        job.run()
        _raise(job)
        return
    job.thread = threading.Thread(target=job.run, name="hvdlite-checkpoint-writer")
    with _LOCK:
        _PENDING = job
    job.thread.start()


def wait():
    """Joins this process's pending save, if any, and raises its error. Not collective."""
    global _PENDING
    with _LOCK:
        job, _PENDING = _PENDING, None
    if job is None:
        return
    if job.thread is not None:
        job.thread.join()
    _raise(job)


def _raise(job):
    error = job.error
    if error is None:
        return
    if isinstance(error, exceptions.HvdliteError):
        raise error
    raise exceptions.HvdliteError(
        "save_checkpoint(%r) failed on rank %d: %s: %s; the previous checkpoint there stays"
        % (job.path, _rank(), type(job.error).__name__, job.error)
    ) from job.error
