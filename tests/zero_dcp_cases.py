"""Rank body of tests/test_zero_dcp.py: a ZeRO job's checkpoint, converted to
torch.distributed.checkpoint (hvd.parallel.zero_to_dcp), loads into an FSDP2 model on the
"hvdlite" backend with the same parameters and AdamW state; the FSDP2 job's DCP checkpoint,
converted back (dcp_to_zero), loads into a ZeRO job (another stage) with the same again."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch_backend_cases import start


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(step, n):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4 * n, 8, generator=g), torch.randn(4 * n, 4, generator=g)


def _train(model, opt, steps, r, n, first=0):
    for s in range(first, first + steps):
        x, y = _batch(s, n)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[r * 4 : (r + 1) * 4]), y[r * 4 : (r + 1) * 4]).backward()
        opt.step()


def _plain(path):
    """The checkpoint at `path` loaded into one process's model and AdamW (hvd.load_checkpoint
    without ZeRO): {name: parameter}, {name: AdamW state}."""
    import hvdlite.torch as hvd

    model = _model(seed=7)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    hvd.load_checkpoint(path, model, opt)
    params = dict(model.named_parameters())
    return {k: v.detach() for k, v in params.items()}, {k: opt.state[p] for k, p in params.items()}


def _differences(params, states, ref_params, ref_states):
    """(names whose parameter or AdamW state entry differs, bitwise, from the reference, the
    number of tensors compared)."""
    bad = [k for k, v in ref_params.items() if not torch.equal(params[k], v)]
    compared = len(ref_params)
    for k, ref in ref_states.items():
        for key, v in ref.items():
            compared += 1
            if not torch.equal(torch.as_tensor(states[k][key]).float(), torch.as_tensor(v).float()):
                bad.append("%s.%s" % (k, key))
    return bad, compared


def _fsdp2(n):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (n,))
    model = _model(seed=9)  # other values: everything must come from the checkpoint
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _full(model, opt):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {k: v for k, v in msd.items()}, osd["state"]


def round_trip(folder):
    """Returns (differences ZeRO -> FSDP2, the FSDP2 job's next step against one process,
    differences FSDP2 -> ZeRO)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import hvdlite.torch as hvd

    hvd.init()
    r, n = start()
    paths = {k: os.path.join(folder, k) for k in ("zero", "dcp", "dcp2", "zero2", "zero3")}
    try:
        model = _model()
        zero = hvd.ZeroOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01), model, stage=2)
        _train(model, zero, 2, r, n)
        hvd.save_checkpoint(paths["zero"], model, zero)
        if r == 0:
            hvd.parallel.zero_to_dcp(paths["zero"], paths["dcp"])  # offline, one process
        hvd.barrier()
        fsdp, fopt = _fsdp2(n)
        msd, osd = get_state_dict(fsdp, fopt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=paths["dcp"])
        set_state_dict(fsdp, fopt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        there = _differences(*_full(fsdp, fopt), *_plain(paths["zero"]))
        # one more step of the FSDP2 job equals one more step of one process from the checkpoint
        ref = _model(seed=7)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
        hvd.load_checkpoint(paths["zero"], ref, ref_opt)
        _train(fsdp, fopt, 1, r, n, first=2)
        _one_process_step(ref, ref_opt, n)
        full_params, full_states = _full(fsdp, fopt)
        step_err = max((full_params[k] - v).abs().max().item() for k, v in ref.state_dict().items())
        # and back: the FSDP2 job saves DCP, converted to ZeRO, loaded by a stage-3 job
        msd, osd = get_state_dict(fsdp, fopt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=paths["dcp2"])
        if r == 0:
            hvd.parallel.dcp_to_zero(paths["dcp2"], paths["zero2"])
        hvd.barrier()
        model3 = _model(seed=11)
        zero3 = hvd.ZeroOptimizer(torch.optim.AdamW(model3.parameters(), lr=0.01), model3, stage=3)
        hvd.load_checkpoint(paths["zero2"], model3, zero3)
        hvd.save_checkpoint(paths["zero3"], model3, zero3)  # what the ZeRO job now holds
        back = _differences(*_plain(paths["zero3"]), full_params, full_states)
        return there, step_err, back
    finally:
        dist.destroy_process_group()


def _one_process_step(model, opt, n):
    x, y = _batch(2, n)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
