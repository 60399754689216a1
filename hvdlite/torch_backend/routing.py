"""A mixed backend string, e.g. ``init_process_group("cpu:hvdlite,cuda:nccl")``: each call goes
to the backend the string gives its tensors' device.

torch 2.13 makes a Python process group the whole group (see ``delegates``), so the hvdlite
group routes itself: tensors on hvdlite's devices go through hvdlite's core as with the plain
"hvdlite" string; tensors on a device given to gloo, nccl or a plugin go to that backend, built
(or kept, where torch built it before hvdlite's) when torch creates the group, and the call
returns that backend's own ``Work``. One call's tensors must share a device type. ``barrier``
runs on hvdlite (every member of the group takes part whichever backend carries the tensors).
The other backends are registered on the group for their devices, so torch's lookups
(``group._get_backend(device)``, ``_device_types``, the object collectives' device) see them.

A group whose string names hvdlite alone is a plain ``HvdliteProcessGroup``: routing costs
nothing there. Threading: as ``HvdliteProcessGroup`` (torch issues a group's calls from one
thread at a time).
"""

import warnings

import torch
import torch.distributed as dist

from hvdlite.common import exceptions
from hvdlite.torch_backend import delegates, process_group
from hvdlite.torch_backend.process_group import HvdliteProcessGroup

# The calls routed by their tensors' device (every c10d call but barrier, which hvdlite runs).
ROUTED = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather_single",
    "_allgather_base",
    "allgather",
    "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced",
    "allgather_coalesced",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "alltoall_base",
    "alltoall",
    "gather",
    "scatter",
    "send",
    "recv",
    "recv_anysource",
)


def _device_types(args):
    """The device types of every tensor in a call's arguments (tensors, lists, lists of lists)."""
    found = set()
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.add(arg.device.type)
        elif isinstance(arg, (list, tuple)):
            for item in arg:
                if isinstance(item, torch.Tensor):
                    found.add(item.device.type)
                elif isinstance(item, (list, tuple)):
                    found.update(t.device.type for t in item if isinstance(t, torch.Tensor))
    return found


class MixedProcessGroup(HvdliteProcessGroup):
    """An hvdlite group that hands each call on another backend's device to that backend."""

    def _attach(self, device_map, groups, unavailable):
        """groups: device -> torch group taking its tensors; unavailable: device -> why none
        could be built here (raised at the first call on that device)."""
        self._device_map = device_map
        self._label = delegates.label(device_map)
        self._own = frozenset(d for d, b in device_map.items() if b == delegates.HVDLITE)
        self._delegates = groups
        self._unavailable = unavailable

    def _route(self, name, args):
        """The torch group taking this call, or None for hvdlite's own devices."""
        types = _device_types(args)
        if len(types) != 1:
            if not types:
                return None
            raise exceptions.InvalidArgumentError(
                "%s on %s: tensors on %s in one call; the group's backend %r sends each device's "
                "tensors to its own backend, so pass one call the tensors of one device"
                % (name, self, " and ".join(sorted(types)), self._label)
            )
        return self.delegate(next(iter(types)), name)

    def delegate(self, device, name="delegate"):
        """The torch group taking the tensors of `device` (a device type, "cuda"), or None for
        hvdlite's own devices; raises as a call `name` on that device would."""
        if self._closed:
            self._name(name, "")  # raises: the group was destroyed
        if device in self._own:
            return None
        group = self._delegates.get(device)
        if group is not None:
            return group
        if device in self._unavailable:
            raise exceptions.NotSupportedError("%s on %s: %s" % (name, self, self._unavailable[device]))
        raise exceptions.NotSupportedError(
            "%s on %s: tensors on %s, a device the group's backend %r gives no backend; add "
            "'%s:<backend>' to the string passed to init_process_group"
            % (name, self, device, self._label, device)
        )

    def shutdown(self):
        """Shuts the other backends down, then hvdlite's part (HvdliteProcessGroup.shutdown),
        which runs even where another backend's shutdown raised."""
        try:
            if not self._closed:
                for group in self._delegates.values():
                    group.shutdown()
        finally:
            super().shutdown()

    def __repr__(self):
        label = getattr(self, "_label", "")
        return "HvdliteProcessGroup(set %d, ranks %s, %r)" % (self._set_id, self._members, label)


def _routed(name):
    own = getattr(HvdliteProcessGroup, name)

    def method(self, *args):
        group = self._route(name, args)
        if group is None:
            return own(self, *args)
        return getattr(group, name)(*args)

    method.__name__ = name
    method.__doc__ = "%s, on the backend the group's string gives the tensors' device." % name
    return method


for _name in ROUTED:
    setattr(MixedProcessGroup, _name, _routed(_name))


def _build_others(others, device_map, built, dist_backend_opts, backend_options):
    """(device -> (backend type, torch group or None, backend or None), device -> why none can
    be built here) for the devices the string gives to other backends."""
    opts = dist_backend_opts
    members = list(opts.global_ranks_in_group)  # as torch gives its own backends: [] for the world
    spec = (opts.group_rank, opts.group_size, opts.timeout, members, opts.group_id, backend_options)
    built_here, unavailable = {}, {}
    for device, name in others.items():
        kind = dist.Backend.backend_type_map.get(name, dist.ProcessGroup.BackendType.CUSTOM)
        if delegates.available(name):
            built_here[device] = (kind, *delegates.build(device, name, built, opts.store, spec))
        else:
            built_here[device] = (kind, None, None)
            unavailable[device] = delegates.unavailable_message(device, name, device_map)
    return built_here, unavailable


def create(dist_backend_opts, backend_options):
    """torch's creator: a plain hvdlite group where the string names hvdlite alone, else a
    MixedProcessGroup with the other devices' backends (built here, on every member, in the
    order of the string, before hvdlite's part, so a backend that fails to build leaves no
    process set behind; see ``delegates``)."""
    context = delegates.creation_context()
    if context is None:
        warnings.warn(
            "hvdlite: torch %s created a group without _new_process_group_helper's backend_config "
            "on the stack, so the group is hvdlite's for every device; a per-device string such "
            "as 'cpu:hvdlite,cuda:nccl' is not honoured on this torch" % torch.__version__,
            stacklevel=2,
        )
    device_map = context[0] if context else {}
    others = {d: b for d, b in device_map.items() if b != delegates.HVDLITE}
    if not others:
        return process_group.create(dist_backend_opts, backend_options)
    for name in others.values():
        delegates.check_supported(name, device_map)
    built_here, unavailable = _build_others(
        others, device_map, context[1], dist_backend_opts, backend_options
    )
    pg = process_group.create(dist_backend_opts, backend_options, cls=MixedProcessGroup)
    for device, (kind, _, backend) in built_here.items():
        pg._register_backend(torch.device(device), kind, backend)
    for device in device_map.keys() - others.keys():
        pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, None)
    groups = {d: group for d, (_, group, _) in built_here.items() if group is not None}
    pg._attach(device_map, groups, unavailable)
    return pg


__all__ = ["ROUTED", "MixedProcessGroup", "create"]
