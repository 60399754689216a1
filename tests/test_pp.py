"""Pipeline parallelism on real ranks: every schedule on 2 and 4 pipeline ranks and several
microbatch counts (fewer than the stages too, and an uneven split) gives the losses and
gradients of one process on the whole batch. Stages pass two tensors and every stage takes
a keyword argument."""

import numpy as np
from helpers import run_pooled
from pp_models import reference

SCHEDULES = ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"]


def _configs(p):
    """(schedule, stages per rank, microbatches, batch rows)."""
    ms = [1, 2, 3, 4] if p == 2 else [2, 4, 8]
    out = [(name, 2 if "Interleaved" in name else 1, m, 12) for name in SCHEDULES for m in ms]
    out += [("ScheduleInterleavedZeroBubble", 1, m, 12) for m in ms]  # one stage per rank: ZB-H1
    return out + [("Schedule1F1B", 1, 4, 10), ("ScheduleInterleavedZeroBubble", 2, 4, 10)]  # uneven split


def run_pipeline(hvd, pp_set, name, v, m, rows):
    """This rank's (losses, {stage: grads}) for one step of schedule `name`."""
    import pp_models

    P = hvd.parallel
    p = pp_set.size()
    model = pp_models.chunks(p * v)
    mine = [s for s in range(p * v) if s % p == pp_set.rank()]
    stages = [P.PipelineStage(model[s], s, p * v, process_set=pp_set) for s in mine]
    cls = getattr(P, name)
    sched = cls(stages if v > 1 else stages[0], m, loss_fn=pp_models.loss_fn)
    x, y, gain = pp_models.batch(rows)
    losses: list = []
    out = sched.step(x, target=y, losses=losses, gain=gain)
    grads = {s: [q.grad.numpy().copy() for q in model[s].parameters()] for s in mine}
    return [float(t) for t in losses], grads, None if out is None else tuple(out.shape)


def _pp_body():
    """Both pipeline sizes in one 4-rank job: two pp=2 pipelines side by side (hvd.Mesh(pp=2,
    dp=2)), then one pp=4 pipeline."""
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    out = {}
    for p in (2, 4):
        mesh = hvd.Mesh(pp=p, dp=-1)
        out[p] = {cfg: run_pipeline(hvd, mesh.process_set("pp"), *cfg) for cfg in _configs(p)}
    errors = _bad_configs(hvd, mesh)
    # Any process set that holds the stages, not only a Mesh's: ranks 3 and 1 (set ranks 1, 0).
    plain = hvd.add_process_set([1, 3])
    if plain.included():
        out["plain"] = {cfg: run_pipeline(hvd, plain, *cfg) for cfg in _PLAIN_CONFIGS}
    hvd.shutdown()
    return out, errors


_PLAIN_CONFIGS = [("Schedule1F1B", 1, 4, 12), ("ScheduleInterleavedZeroBubble", 2, 4, 12)]


def _check(outs, configs, p):
    refs = {}
    for name, v, m, rows in configs:
        key = (p * v, rows)
        if key not in refs:
            refs[key] = reference(p * v, rows)
        ref_loss, ref_grads = refs[key]
        last = (p * v - 1) % p
        losses, _, shape = outs[last][(name, v, m, rows)]
        assert len(losses) == m and shape == (rows, 3)
        split = np.array_split(np.arange(rows), m)
        weighted = sum(loss * len(s) / rows for loss, s in zip(losses, split))
        assert abs(weighted - ref_loss) < 1e-6 * max(1.0, abs(ref_loss)), (name, v, m, rows)
        for r in range(p):
            for s, grads in outs[r][(name, v, m, rows)][1].items():
                for g, want in zip(grads, ref_grads[s]):
                    np.testing.assert_allclose(
                        g, want, rtol=1e-5, atol=1e-6, err_msg=str((name, v, m, rows, s))
                    )


def test_every_schedule_equals_one_process():
    outs = run_pooled(_pp_body, 4, timeout=200)
    _check([outs[0][0][2], outs[2][0][2]], _configs(2), 2)  # the pp=2 pipeline of ranks 0 and 2
    _check([outs[1][0][2], outs[3][0][2]], _configs(2), 2)  # and its twin on ranks 1 and 3
    _check([o[0][4] for o in outs], _configs(4), 4)
    _check([outs[1][0]["plain"], outs[3][0]["plain"]], _PLAIN_CONFIGS, 2)  # hvd.add_process_set([1, 3])
    for _, errors in outs:
        assert "belongs on pipeline rank" in errors[0]
        assert "divisible" in errors[1]
        assert "need 2 stages per rank; this rank passed 1" in errors[2]


def _bad_configs(hvd, mesh):
    """Impossible configurations fail at construction, before any rank communicates."""
    import torch

    from hvdlite.parallel import ScheduleError

    P, ps = hvd.parallel, mesh.process_set("pp")
    errors = []
    try:
        P.PipelineStage(torch.nn.Linear(2, 2), (ps.rank() + 1) % 4, 4, process_set=ps)
    except hvd.InvalidArgumentError as e:
        errors.append(str(e))
    stages = [
        P.PipelineStage(torch.nn.Linear(2, 2), s, 8, process_set=ps) for s in (ps.rank(), ps.rank() + 4)
    ]
    try:
        P.ScheduleInterleaved1F1B(stages, 9, loss_fn=torch.nn.functional.mse_loss)
    except ScheduleError as e:
        errors.append(str(e))
    try:
        P.Schedule1F1B(stages[0], 4, loss_fn=torch.nn.functional.mse_loss)
    except hvd.InvalidArgumentError as e:
        errors.append(str(e))
    return errors
