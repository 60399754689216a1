"""hvdlite as a torch.distributed backend: ``dist.init_process_group("hvdlite")``.

``import hvdlite.torch`` calls :func:`register`, after which unchanged torch code
(DDP, FSDP2, DTensor, ``torch.distributed.pipelining``, Lightning) runs its collectives
on hvdlite's core: the same runtime, transport and liveness as ``hvd.*`` calls in the
same job. A process group becomes an hvdlite process set (the default group is the
global set); each torch call becomes one submission through ``hvdlite.common``, as the
Horovod-style API makes them. See docs/torch_backend.md.

This module only registers the backend: the process group itself
(``hvdlite.torch_backend.process_group``, and ``routing`` for a mixed string such as
"cpu:hvdlite,cuda:nccl") is imported when torch first creates one.
"""

__all__ = ["BACKEND_NAME", "register"]

BACKEND_NAME = "hvdlite"
"""The name torch.distributed knows the backend by."""


def _create(dist_backend_opts, backend_options):
    """torch's creator (extended API): one process group for the group torch describes (with
    torch's backends for the devices a mixed backend string gives to others)."""
    from hvdlite.torch_backend.routing import create

    return create(dist_backend_opts, backend_options)


def register():
    """Registers the "hvdlite" backend with torch.distributed (idempotent). Devices: cpu,
    and cuda where hvdlite's CUDA module is built."""
    import torch.distributed as dist

    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    from hvdlite.common.capabilities import cuda_built

    devices = ["cpu", "cuda"] if cuda_built() else ["cpu"]
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices)
    from hvdlite.torch_backend import rendezvous

    rendezvous.install()
