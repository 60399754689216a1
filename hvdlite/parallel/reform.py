"""Re-forming a mesh on the survivors of an elastic job: which rank takes which coordinate.
Pure arithmetic (no runtime), so every rank computes the same plan from the same gathered facts.

A rank of a mesh holds the model and optimizer shard of its *coordinate*: its place along every
axis but dp, ``(pp, ep, cp, tp)``. The dp replicas of one coordinate hold identical state (data
parallelism averages their gradients), so a coordinate survives while any one of its replicas
does. After a loss the mesh keeps every other axis and shrinks dp to the largest size the
survivors fill completely: the fewest surviving replicas of any coordinate. For each coordinate
the holders with the lowest ranks (so the lowest old dp indices) are kept, chosen so that the
members of every group ascend with their coordinate, as the layers need (process sets order
their members by rank; the driver keeps the survivors' order, so whole replicas lost with a host
always fit; where the survivors cannot be so ordered, dp shrinks further). Holders beyond the new
dp size are *released* (they leave the job), and so are ranks that hold no coordinate (workers
started after the loss: they have no state to bring).

A coordinate with no surviving holder (always the case where dp was 1) cannot be rebuilt from
the survivors alone. Where the job keeps buddy copies of its shards (MeshState(buddies=True), the
default at dp=1), a *spare* takes it: a worker the elastic driver started on a free slot, which
asked for a coordinate (MeshState.join()). The plan then has dp=1, ``restored`` names what each
spare restores, and where the spare's rank does not fit the rank order of the layout (the driver
starts new workers after the survivors), ``order`` is the rank order to ask the driver for: the
next generation's rank i is the current rank order[i], and planning runs again there. Without a
spare for each such coordinate ``plan`` raises NotSupportedError naming it, the ranks that held it
and (``detail``) where its buddy copy is.
"""

import collections
import itertools

from hvdlite.common import exceptions

KEY_AXES = ("pp", "ep", "cp", "tp")  # a coordinate: every axis but dp, outermost first

Plan = collections.namedtuple(
    "Plan", ["dp", "members", "released", "restored", "order"], defaults=(None, None)
)
Plan.__doc__ = """dp: the new dp size; members: global ranks in layout order (MeshLayout's
`members`), None when `order` is set; released: the ranks that leave, ascending; restored: None,
or {spare rank: the coordinate it takes}; order: None, or the ranks in the order the next
generation must number them (members in layout order; the released ranks leave)."""


def key_of(coords):
    """The coordinate (pp, ep, cp, tp) of a MeshCoords: what shard a rank holds."""
    return tuple(getattr(coords, a) for a in KEY_AXES)


def plan(sizes, holders, lost_from=None, spares=(), detail=None):
    """The re-formed layout. sizes: {axis: size} of the mesh before the loss (its dp is the old
    one); holders: {global rank in the new job: (coordinate, old dp index), or None for a rank
    that holds nothing}; lost_from: optional {coordinate: old global ranks that held it}, named in
    the error when a coordinate has no surviving holder; spares: ranks holding nothing that may
    take such a coordinate (restored from its buddy copy); detail: optional {coordinate: text}
    added to that error (where its buddy copy was)."""
    keys = list(itertools.product(*(range(sizes[a]) for a in KEY_AXES)))
    by_key: dict[tuple[int, ...], list[tuple[int, int]]] = {k: [] for k in keys}
    for rank, held in holders.items():
        if held is not None:
            key, old_dp = tuple(held[0]), held[1]
            if key not in by_key:
                raise exceptions.InvalidArgumentError(
                    "rank %d holds coordinate %s, outside mesh %s" % (rank, _key_text(key), sizes)
                )
            by_key[key].append((old_dp, rank))
    lost = [k for k in keys if not by_key[k]]
    spares = sorted(r for r in spares if holders.get(r, 0) is None)
    if len(lost) > len(spares):
        raise exceptions.NotSupportedError(_lost_message(sizes, lost, lost_from or {}, spares, detail or {}))
    restored = {r: k for k, r in zip(lost, spares)} or None
    for r, k in (restored or {}).items():
        by_key[k].append((0, r))
    for dp in range(min(len(v) for v in by_key.values()), 0, -1):
        members = _chain(sizes, dp, {k: sorted(r for _, r in v) for k, v in by_key.items()})
        if members is not None:
            return Plan(dp, members, sorted(set(holders) - set(members)), restored)
        if restored:  # dp is 1: every rank order fits once the driver renumbers the ranks
            order = _chain(sizes, 1, {k: sorted(r for _, r in v) for k, v in by_key.items()}, ordered=False)
            return Plan(1, None, sorted(set(holders) - set(order)), restored, order)
    raise exceptions.NotSupportedError(
        "the mesh cannot re-form: the survivors' ranks %s, in the order the elastic driver gave "
        "them, cannot be laid out with every axis in rank order (process sets order their members "
        "by rank); restart from the last checkpoint" % sorted(holders)
    )


def _chain(sizes, dp, ranks_of, ordered=True):
    """members for `dp` replicas: layout positions (pp, d, ep, cp, tp) in order, each given the
    lowest unused holder of its coordinate above the previous position's, so that every group's
    members ascend with their coordinate (process sets order members by rank); None when the
    holders cannot be so ordered. Lowest first: the lowest old dp indices are kept. ordered=False:
    the lowest unused holder, in whatever rank order (the order to ask the driver for)."""
    members, prev = [], -1
    for pp in range(sizes["pp"]):
        for _ in range(dp):
            for rest in itertools.product(*(range(sizes[a]) for a in KEY_AXES[1:])):
                pick = next((r for r in ranks_of[(pp,) + rest] if r > prev or not ordered), None)
                if pick is None:
                    return None
                members.append(pick)
                ranks_of[(pp,) + rest] = [r for r in ranks_of[(pp,) + rest] if r != pick]
                prev = pick
    return members


def _key_text(key):
    return "(%s)" % ", ".join("%s=%d" % kv for kv in zip(KEY_AXES, key))


def _lost_message(sizes, lost, lost_from, spares=(), detail=None):
    detail = detail or {}
    shown = "; ".join(
        "%s, held by rank(s) %s%s" % (_key_text(k), lost_from.get(k, "?"), detail.get(k, ""))
        for k in lost[:4]
    ) + (" and %d more" % (len(lost) - 4) if len(lost) > 4 else "")
    if detail:
        why = (
            "; its shard is kept as a buddy copy, but no replacement worker joined to take it (%d "
            "joined for %d coordinate(s)): the elastic driver starts one where a free slot is left "
            "(hosts with more slots than --max-np, or a discovery script that finds one), and the "
            "script must call hvd.parallel.MeshState.join() in it. Otherwise" % (len(spares), len(lost))
        )
    else:
        why = (
            ". A mesh job keeps no copy of a shard outside its dp replicas unless it keeps buddy "
            "copies (hvd.parallel.MeshState(..., buddies=True), the default where dp is 1), so"
        )
    return (
        "the mesh cannot re-form: no surviving rank holds the model and optimizer shard of "
        "coordinate %s of the mesh (pp=%d, dp=%d, ep=%d, cp=%d, tp=%d): every data-parallel "
        "replica of %s was lost%s%s restart from the last checkpoint the job saved (each rank's "
        "shard), or run with dp >= 2 on hosts that hold different replicas"
        % (
            shown,
            sizes["pp"],
            sizes["dp"],
            sizes["ep"],
            sizes["cp"],
            sizes["tp"],
            "it" if len(lost) == 1 else "each",
            " (dp is 1: there is no replica)" if sizes["dp"] == 1 else "",
            why,
        )
    )
