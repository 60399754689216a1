"""hvd.Mesh: the rank layout (pure arithmetic, any size) and the process sets it registers
(real ranks: every axis group reduces over exactly its members)."""

import pytest
from helpers import run_ranks

from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.parallel import MeshLayout


def test_layout_tp_innermost_pp_outermost():
    lay = MeshLayout(8, pp=2, dp=-1, tp=2)
    assert lay.sizes == {"pp": 2, "dp": 2, "ep": 1, "cp": 1, "tp": 2}
    assert lay.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.groups(("dp", "tp")) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.groups(("tp", "dp")) == lay.groups(("dp", "tp"))
    assert lay.coords_of(5) == (1, 0, 0, 0, 1)
    assert all(lay.rank_of(**lay.coords_of(r)._asdict()) == r for r in range(8))


def test_layout_64_ranks_every_group_once():
    lay = MeshLayout(64, pp=4, dp=-1, ep=2, tp=2)
    assert lay.sizes["dp"] == 4
    groups = lay.all_groups()
    assert len({tuple(g) for g in groups}) == len(groups)
    for axis in ("pp", "dp", "ep", "tp", ("dp", "ep")):
        gs = lay.groups(axis)
        assert sorted(r for g in gs for r in g) == list(range(64))
        assert all(lay.group_of(axis, g[0]) == g for g in gs)


def test_layout_errors_say_what_to_fix():
    with pytest.raises(InvalidArgumentError, match="not divisible"):
        MeshLayout(6, pp=4, dp=-1)
    with pytest.raises(InvalidArgumentError, match="has 4 ranks but the job has 8"):
        MeshLayout(8, pp=2, dp=1, tp=2)
    with pytest.raises(InvalidArgumentError, match="at most one -1"):
        MeshLayout(8, pp=-1, dp=-1)
    with pytest.raises(InvalidArgumentError, match="mesh axis"):
        MeshLayout(8, dp=-1).groups("xx")


def _mesh_sums(sizes):
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    mesh = hvd.Mesh(**sizes)
    out = {"repr": repr(mesh), "describe": mesh.describe(), "coords": tuple(mesh.coords)}
    for axis in ("pp", "dp", "ep", "tp", ("dp", "ep"), ("dp", "tp")):
        ps = mesh.process_set(axis)
        got = hvd.allreduce(
            torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="m.%s" % (axis,), process_set=ps
        )
        out[str(axis)] = (int(got.item()), mesh.rank(axis), mesh.size(axis), ps.ranks)
    mesh.remove()
    hvd.shutdown()
    return out


@pytest.mark.slow  # 8 ranks; tests/test_mesh_3d.py covers the mesh's sets on 4 in the default suite
def test_mesh_process_sets_on_eight_ranks():
    outs = run_ranks(_mesh_sums, 8, args=({"pp": 2, "dp": -1, "tp": 2},), timeout=120)
    lay = MeshLayout(8, pp=2, dp=-1, tp=2)
    for r, out in enumerate(outs):
        assert out["coords"] == tuple(lay.coords_of(r))
        assert "Mesh(pp=2, dp=2, ep=1, cp=1, tp=2)" in out["repr"]
        for axis in ("pp", "dp", "ep", "tp", ("dp", "ep"), ("dp", "tp")):
            total, idx, n, ranks = out[str(axis)]
            assert ranks == lay.group_of(axis, r)
            assert total == sum(ranks) and idx == ranks.index(r) and n == len(ranks)


def test_layout_cp_sits_between_ep_and_tp():
    lay = MeshLayout(8, dp=-1, cp=2, tp=2)
    assert lay.sizes == {"pp": 1, "dp": 2, "ep": 1, "cp": 2, "tp": 2}
    assert lay.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.groups(("cp", "tp")) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.groups(("dp", "cp")) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_mesh_registers_single_axes_and_used_combinations_only():
    lay = MeshLayout(16, pp=2, dp=2, ep=1, cp=2, tp=2)
    every = lay.all_groups("all")
    used = lay.all_groups()
    # 5 axes: 31 combinations before; now the 5 axes and COMBINATIONS, deduplicated.
    assert len(used) < len(every)
    expected = {
        tuple(g) for a in ("pp", "dp", "ep", "cp", "tp", ("dp", "ep"), ("dp", "cp")) for g in lay.groups(a)
    }
    assert {tuple(g) for g in used} == expected
