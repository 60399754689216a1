"""The parameter servers' replicas (hvdlite/torch/parallel/sparse/replica.py) in one process:
the buddy ring, the wire format and the undo log. The multi-process behaviour (a server
SIGKILLed, its buddy taking its rows) is in tests/test_sparse_elastic.py (slow)."""

import pytest
import torch

from hvdlite.common import exceptions
from hvdlite.parallel.sparse import TableLayout
from hvdlite.torch.parallel.sparse import replica as rp
from hvdlite.torch.parallel.sparse.optim import RowOptimizer


def _copy(rows, dim, start, kind="adam", seed=0):
    w = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
    opt = RowOptimizer(kind, w, 0.1)
    return rp.SlotCopy([w], [opt.state], [start]), opt


def test_ring_puts_buddies_on_other_hosts_one_each():
    for hosts in ([0, 0, 1, 1], [0, 1, 2], [5, 5, 5, 7, 7, 7], [0, 0, 0, 1]):
        ring = rp.ring(hosts)
        assert sorted(ring.values()) == list(range(len(hosts)))  # a permutation: one ward each
        if max(hosts.count(h) for h in hosts) * 2 <= len(hosts):
            assert all(hosts[s] != hosts[b] for s, b in ring.items()), (hosts, ring)
    assert rp.ring([3, 3]) == {0: 1, 1: 0}  # one host: the next server


def test_a_replica_follows_the_steps_and_both_roll_back():
    own, opt = _copy(6, 3, start=10)
    mirror, _ = _copy(6, 3, start=10, seed=1)
    rp.decode_into(mirror, rp.encode(own, 0, torch.arange(10, 16)), record=False)  # seed
    first = own.weights[0].clone(), {k: v.clone() for k, v in own.states[0].items()}
    for step in range(3):
        rows = torch.tensor([step, 4])
        own.remember(0, rows)
        with torch.no_grad():
            opt.update(rows, torch.full((2, 3), 0.5 + step))
        touched = own.close_step()
        rp.decode_into(mirror, rp.encode(own, 0, touched[0] + 10), record=True)
        mirror.close_step()
        assert torch.equal(mirror.weights[0], own.weights[0])
        assert all(torch.equal(mirror.states[0][k], v) for k, v in own.states[0].items())
    own.confirm(1)
    assert own.reach() == (1, 3) and mirror.reach() == (0, 3)
    for copy in (own, mirror):
        copy.rollback(0 if copy is mirror else 1)
    mirror_first = mirror.weights[0]
    assert torch.equal(mirror_first, first[0])
    assert all(torch.equal(mirror.states[0][k], v) for k, v in first[1].items())  # step count too
    assert own.steps == 1 and not torch.equal(own.weights[0], first[0])


def test_replication_needs_two_servers_full_rows_and_no_staleness():
    rows = {"a": TableLayout(10, 4, "row", 3, 0, (1, 2))}
    rp.check_replicable((1, 2), rows, 0)  # fine
    with pytest.raises(exceptions.InvalidArgumentError, match="at least two ranks"):
        rp.check_replicable((2,), rows, 0)
    with pytest.raises(exceptions.NotSupportedError, match="staleness=1"):
        rp.check_replicable((1, 2), rows, 1)
    cols = {"b": TableLayout(10, 4, "column", 3, 0, (1, 2))}
    with pytest.raises(exceptions.NotSupportedError, match=r"column sharding of \['b'\]"):
        rp.check_replicable((1, 2), cols, 0)
