"""Where the tokens of one sequence live under context parallelism: pure arithmetic, no runtime.

A sequence of S tokens is split over the P members of a context-parallel set with no
divisibility rule (blocks differ by at most one token, the first members taking the extra, as
reducescatter splits rows):

- contiguous (non-causal attention): member i holds block i of P;
- zigzag (causal attention): the sequence is cut into 2P chunks and member i holds chunks i
  and 2P-1-i, so that under a causal mask every member has about the same work (the early
  chunk sees few keys, the late one many).

Every member can compute every member's global token positions from S alone; the attention
gathers the members' token counts once per call to learn S and to check that the input was
sharded with the same layout.
"""

from hvdlite.common import exceptions


def _block(n, parts, index):
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def shard_ranges(seq_len, members, index, zigzag):
    """The (start, length) ranges of the full sequence that member `index` holds, in the order
    its local tokens are stored."""
    if zigzag:
        return [_block(seq_len, 2 * members, index), _block(seq_len, 2 * members, 2 * members - 1 - index)]
    return [_block(seq_len, members, index)]


def local_length(seq_len, members, index, zigzag):
    """How many tokens member `index` holds."""
    return sum(n for _, n in shard_ranges(seq_len, members, index, zigzag))


def positions(seq_len, members, index, zigzag):
    """The global positions of member `index`'s local tokens, in local order."""
    return [p for start, n in shard_ranges(seq_len, members, index, zigzag) for p in range(start, start + n)]


def check_lengths(lengths, zigzag, what="context_parallel_attention"):
    """S = sum(lengths), after checking that every member holds what the layout gives it.
    Raises InvalidArgumentError naming the members that do not, and the fix."""
    seq_len, members = sum(lengths), len(lengths)
    want = [local_length(seq_len, members, i, zigzag) for i in range(members)]
    if list(lengths) != want:
        bad = [i for i in range(members) if lengths[i] != want[i]]
        raise exceptions.InvalidArgumentError(
            "%s: members %s hold %s tokens, but a %s layout of %d tokens over %d members gives them %s; "
            "shard the sequence with hvd.parallel.cp_shard(x, seq_dim, process_set, causal=%s), with the "
            "same causal flag as the attention"
            % (
                what,
                bad,
                [lengths[i] for i in bad],
                "zigzag (causal)" if zigzag else "contiguous (non-causal)",
                seq_len,
                members,
                [want[i] for i in bad],
                zigzag,
            )
        )
    return seq_len
