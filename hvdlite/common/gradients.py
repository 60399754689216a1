"""Horovod's gradient definitions for its collectives, as framework-neutral
policy. Adapters implement the backward passes with their own tensors, using
these rules so that every framework differentiates the same way:

  allreduce(x, op)      grad = allreduce(dy, same op, same pre/postscale)
  grouped_allreduce     grad_i = grouped_allreduce(dy_i, same op)
  allgather(x)          grad = allreduce(dy, ALLGATHER_GRAD_OP), then this
                        member's rows (offset = rows of the members before it)
  broadcast(x, root)    grad = allreduce(dy, BROADCAST_GRAD_OP) on the root,
                        zeros elsewhere
  alltoall(x, splits)   grad = alltoall(dy, splits = the splits received)
  reducescatter(x, op)  grad = allgather(dy) * reducescatter_grad_scale(...)

The averaging choices follow Horovod >= 0.22 (its PR 2687 made the allgather
and broadcast gradients averages), so scripts see the gradients they saw.
"""

from hvdlite.common import dtypes

ALLGATHER_GRAD_OP = dtypes.Average
BROADCAST_GRAD_OP = dtypes.Average


def allgather_grad_slice(rows_per_member, member_index):
    """(offset, rows) of a member's block in the allgathered gradient."""
    rows = [int(r) for r in rows_per_member]
    return sum(rows[:member_index]), rows[member_index]


def reducescatter_grad_scale(op, prescale, postscale, set_size):
    """Factor applied to the allgathered upstream gradient of a reducescatter:
    Horovod scales a Sum by the number of members, leaves an Average as it is,
    and applies the pre- and postscale factors."""
    scale = float(prescale) * float(postscale)
    return scale * set_size if op == dtypes.Sum else scale
