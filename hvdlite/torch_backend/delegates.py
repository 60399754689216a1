"""torch's own backends for the devices that a mixed backend string ("cpu:hvdlite,cuda:nccl")
gives to another backend than hvdlite.

torch 2.13 builds a group's backends device by device, in the order of the string, and a
creator that returns a Python ``ProcessGroup`` (as hvdlite's does) replaces the whole group:
torch stops there (``_new_process_group_helper``: ``if issubclass(type(backend_class),
ProcessGroup): pg = backend_class; break``). So with "cpu:hvdlite,cuda:nccl" torch never builds
NCCL, and with "cpu:gloo,cuda:hvdlite" the gloo it built first is dropped with its group. The
hvdlite group therefore builds (or keeps) those backends itself, once per group, while torch
creates the group: every member creates a group at the same point of its program, so building
here is as collective as torch's own construction.

torch passes a creator no backend string. The device -> backend map is read from the frame of
the ``_new_process_group_helper`` call that is creating this group (its ``backend_config``, and
its ``pg``, torch's group holding the backends built before hvdlite's). Where that frame is not
found (another torch), :func:`creation_context` returns None and the group is hvdlite's alone.

Threading: everything here runs in torch's group creation, on the creating thread.
"""

import sys
from types import FrameType

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore as _PrefixStore  # type: ignore[attr-defined]

from hvdlite.common import exceptions

_HELPER = "_new_process_group_helper"
_C10D_MODULE = "torch.distributed.distributed_c10d"
_MAX_DEPTH = 12
HVDLITE = "hvdlite"


def creation_context():
    """(device -> backend name, torch's group built so far or None) of the group torch is
    creating on this thread, or None where no torch group creation is on the stack."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        if frame.f_code.co_name == _HELPER and frame.f_globals.get("__name__") == _C10D_MODULE:
            config = frame.f_locals.get("backend_config")
            if config is None or not hasattr(config, "get_device_backend_map"):
                return None
            device_map = {str(d): str(b).lower() for d, b in config.get_device_backend_map().items()}
            built = frame.f_locals.get("pg")
            return device_map, built if type(built) is dist.ProcessGroup else None
        frame = frame.f_back
    return None


def _backend_type(name):
    return dist.Backend.backend_type_map.get(name, dist.ProcessGroup.BackendType.CUSTOM)


def label(device_map):
    """The backend string of a device -> backend map, as torch prints it."""
    return ",".join("%s:%s" % pair for pair in device_map.items())


def unavailable_message(device, name, device_map):
    """Why `name` cannot take `device`'s tensors in this process, with the fix."""
    fixed = dict(device_map, **{device: HVDLITE})
    return (
        "tensors on %s go to %r in the group's backend %r, but this torch (%s) has no %s built "
        "in: use a torch build with %s, or give %s to hvdlite (%r)"
        % (
            device,
            name,
            label(device_map),
            torch.__version__,
            name.upper(),
            name.upper(),
            device,
            label(fixed),
        )
    )


def _gloo(store, rank, size, timeout, members, group_name):
    backend = dist.ProcessGroupGloo(store, rank, size, timeout=timeout)
    backend.options.global_ranks_in_group = members
    backend.options.group_name = group_name
    backend._set_sequence_number_for_group()
    return backend


def _nccl(store, rank, size, timeout, members, group_name, backend_options):
    from torch.distributed import ProcessGroupNCCL

    if isinstance(backend_options, ProcessGroupNCCL.Options):
        options = backend_options
    else:
        options = ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
    options._timeout = timeout
    options.global_ranks_in_group = members
    options.group_name = group_name
    backend = ProcessGroupNCCL(store, rank, size, options)
    backend._set_sequence_number_for_group()
    return backend


def _plugin(name, store, rank, size, timeout, members, group_name, backend_options):
    plugin = dist.Backend._plugins[name.upper()]
    if not plugin.extended_api:
        return plugin.creator_fn(store, rank, size, timeout)
    opts = dist.distributed_c10d._DistributedBackendOptions()  # type: ignore[attr-defined]
    opts.store, opts.group_rank, opts.group_size = store, rank, size
    opts.timeout, opts.group_id, opts.global_ranks_in_group = timeout, group_name, members
    return plugin.creator_fn(opts, backend_options)


_TORCH_BUILT = ("gloo", "nccl")


def check_supported(name, device_map):
    """Raises NotSupportedError where the hvdlite group cannot build `name` beside itself."""
    if name not in _TORCH_BUILT and name.upper() not in dist.Backend._plugins:
        raise exceptions.NotSupportedError(
            "backend %r: beside hvdlite, a group builds gloo, nccl or a registered plugin, not %r; "
            "give that device to one of those or to hvdlite" % (label(device_map), name)
        )


def available(name):
    """Whether this process can build `name` (torch built without NCCL cannot)."""
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available()
    return True


def build(device, name, built, store, spec):
    """(torch group taking `device`'s tensors, the backend to register on hvdlite's group or
    None) for `device`, which the group's backend string gives to `name` (check_supported and available first).
    `spec`: rank, size, timeout, global ranks, group name, backend options. Blocks while the
    backend connects (gloo: every member, bounded by the group's timeout)."""
    rank, size, timeout, members, group_name, backend_options = spec
    kind = _backend_type(name)
    backend = None
    if built is not None and torch.device(device) in built._device_types:
        backend = built._get_backend(torch.device(device))  # torch built it before hvdlite's
    else:
        own_store = _PrefixStore("hvdlite-delegate/%s/" % device, store)
        if name == "gloo":
            backend = _gloo(own_store, rank, size, timeout, members, group_name)
        elif name == "nccl":
            backend = _nccl(own_store, rank, size, timeout, members, group_name, backend_options)
        else:
            backend = _plugin(name, own_store, rank, size, timeout, members, group_name, backend_options)
    if isinstance(backend, dist.ProcessGroup):
        return backend, None  # a plugin's Python group: it takes the calls itself
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(kind)
    group._register_backend(torch.device(device), kind, backend)
    return group, backend


__all__ = [
    "HVDLITE",
    "available",
    "build",
    "check_supported",
    "creation_context",
    "label",
    "unavailable_message",
]
