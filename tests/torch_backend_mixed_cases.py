"""Rank bodies of tests/test_torch_backend_mixed.py: init_process_group with a per-device backend
string that names hvdlite beside gloo or nccl. Each call must run on the backend the string
gives its tensors' device: proven by the backend torch reports for the device, the type of the
Work a call returns, and whether hvdlite's group counted the call (it names every call it
submits to its core, so a call that went elsewhere leaves no count)."""

import torch
import torch.distributed as dist

from hvdlite.torch_backend.work import HvdliteWork


def _start(backend):
    import hvdlite.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def _hvdlite_calls(group):
    """How many calls of each kind hvdlite's core was given on `group` (barrier excluded)."""
    return {kind: n for (kind, _), n in group._counts.items() if kind != "barrier"}


def _cpu_collectives(r, n, group=None):
    """Every kind of call on CPU tensors; True where the result is right."""
    out = {}
    x = torch.arange(4, dtype=torch.float32) + r
    work = dist.all_reduce(x, group=group, async_op=True)
    work.wait()
    out["all_reduce"] = torch.equal(x, n * torch.arange(4, dtype=torch.float32) + sum(range(n)))
    out["work_type"] = type(work).__name__
    gathered = torch.zeros(n * 2)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(r)), group=group)
    out["all_gather"] = gathered.tolist() == [float(i) for i in range(n) for _ in range(2)]
    scattered = torch.zeros(2)
    dist.reduce_scatter_tensor(scattered, torch.ones(n * 2), group=group)
    out["reduce_scatter"] = scattered.tolist() == [float(n)] * 2
    b = torch.full((3,), float(r))
    dist.broadcast(b, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    out["broadcast"] = b.tolist() == [0.0] * 3
    a2a = torch.zeros(n)
    dist.all_to_all_single(a2a, torch.full((n,), float(r)), group=group)
    out["all_to_all"] = a2a.tolist() == [float(i) for i in range(n)]
    import torch.distributed._functional_collectives as funcol  # DTensor's and FSDP2's path

    f = funcol.all_reduce(torch.ones(2), "sum", group or dist.group.WORLD)
    out["functional"] = f.tolist() == [float(n)] * 2
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": r}, group=group)
    out["objects"] = objects == [{"rank": i} for i in range(n)]
    dist.barrier(group=group)
    return out


def _ddp_step(r, n):
    """One DDP backward: its gradient equals the mean of every rank's local gradient."""
    torch.manual_seed(0)
    local = torch.nn.Linear(4, 2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model.module.load_state_dict(local.state_dict())
    batch = torch.arange(8, dtype=torch.float32).view(2, 4) * (r + 1)
    model(batch).square().sum().backward()
    local(batch).square().sum().backward()
    grads = [None] * n
    dist.all_gather_object(grads, local.weight.grad)
    return torch.allclose(model.module.weight.grad, sum(grads) / n)


def _p2p(r):
    t = torch.full((2,), 7.0) if r == 0 else torch.zeros(2)
    if r == 0:
        dist.send(t, dst=1)
    elif r == 1:
        dist.recv(t, src=0)
    return r > 1 or t.tolist() == [7.0, 7.0]


def _refusals(pg):
    """A call mixing devices, and one on a device the string names for no backend."""
    out = {}
    for label, tensors in (("mixed", [torch.zeros(1), torch.zeros(1, device="meta")]),
                           ("meta", [torch.zeros(1, device="meta")])):  # fmt: skip
        try:
            pg.allreduce(tensors, dist.AllreduceOptions())
            out[label] = None
        except Exception as e:
            out[label] = "%s: %s" % (type(e).__name__, e)
    return out


def gloo_for_cpu():
    """ "cpu:gloo,cuda:hvdlite": CPU tensors run on torch's gloo (the one torch built before the
    hvdlite group replaced its group), in the default group, a new_group and a DeviceMesh."""
    r, n = _start("cpu:gloo,cuda:hvdlite")
    try:
        pg = dist.group.WORLD
        out = {"backend": str(dist.get_backend()), "group": type(pg).__name__}
        out["cpu_backend"] = type(pg._get_backend(torch.device("cpu"))).__name__
        out["devices"] = sorted(d.type for d in pg._device_types)
        out["world"] = _cpu_collectives(r, n)
        out["p2p"] = _p2p(r)
        out["ddp"] = _ddp_step(r, n)
        sub = dist.new_group(list(range(n - 1, -1, -1)))  # new_group sorts the ranks
        out["sub"] = _cpu_collectives(r, n, sub)
        from torch.distributed.device_mesh import init_device_mesh

        mesh_group = init_device_mesh("cpu", (n,)).get_group()
        m = torch.ones(2)
        dist.all_reduce(m, group=mesh_group)
        out["mesh"] = (m.tolist(), type(mesh_group._get_backend(torch.device("cpu"))).__name__)
        out["hvdlite_calls"] = [_hvdlite_calls(g) for g in (pg, sub, mesh_group)]
        out["refusals"] = _refusals(pg)
        return out
    finally:
        dist.destroy_process_group()


def hvdlite_for_cpu(other):
    """ "cpu:hvdlite,cuda:<other>": CPU tensors run on hvdlite's core; cuda's backend is torch's
    `other` (gloo: built with the group; nccl on a torch without NCCL: an error naming the fix
    at the first call on cuda, and init still works)."""
    backend = "cpu:hvdlite,cuda:%s" % other
    r, n = _start(backend)
    try:
        pg = dist.group.WORLD
        out = {"backend": str(dist.get_backend()), "group": type(pg).__name__}
        out["world"] = _cpu_collectives(r, n)
        out["p2p"] = _p2p(r)
        out["ddp"] = _ddp_step(r, n)
        out["hvdlite_calls"] = sorted(_hvdlite_calls(pg))
        out["devices"] = sorted(d.type for d in pg._device_types)
        try:
            cuda = pg.delegate("cuda")
            out["cuda"] = type(cuda._get_backend(torch.device("cuda"))).__name__
            out["cuda_lookup"] = pg._get_backend(torch.device("cuda")) is cuda._get_backend(
                torch.device("cuda")
            )
        except Exception as e:
            out["cuda"] = "%s: %s" % (type(e).__name__, e)
        sub = dist.new_group(list(range(n)))
        s = torch.ones(1)
        dist.all_reduce(s, group=sub)
        out["sub"] = (s.item(), type(sub).__name__, sorted(_hvdlite_calls(sub)))
        return out
    finally:
        dist.destroy_process_group()


def nccl_for_cuda():
    """ "cpu:hvdlite,cuda:nccl" on a GPU: CUDA tensors run on torch's NCCL, CPU ones on hvdlite."""
    r, n = _start("cpu:hvdlite,cuda:nccl")
    torch.cuda.set_device(r % torch.cuda.device_count())
    try:
        pg = dist.group.WORLD
        out = {"nccl": type(pg._get_backend(torch.device("cuda"))).__name__}
        c = torch.full((4,), float(r + 1), device="cuda")
        work = dist.all_reduce(c, async_op=True)
        work.wait()
        g = torch.zeros(2 * n, device="cuda")
        dist.all_gather_into_tensor(g, torch.full((2,), float(r), device="cuda"))
        torch.cuda.synchronize()
        out["cuda"] = (c.cpu().tolist(), g.cpu().tolist(), isinstance(work, HvdliteWork))
        h = torch.full((4,), float(r + 1))
        dist.all_reduce(h)
        out["cpu"] = (h.tolist(), sorted(_hvdlite_calls(pg)))
        return out
    finally:
        dist.destroy_process_group()
