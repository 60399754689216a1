"""Tensor parallelism (Megatron-style) on hvdlite's public collectives, any device the
collectives take:

  ColumnParallelLinear   weight rows (output features) split over the set
  RowParallelLinear      weight columns (input features) split; partial outputs summed
  VocabParallelEmbedding embedding rows (vocabulary) split; lookups summed
  vocab_parallel_cross_entropy  cross entropy of vocabulary-split logits without gathering
                         them: only the max, the sum of exponentials and the target logit
                         (one number per token each) cross the wire
  SequenceParallelLayerNorm  LayerNorm on sequence-split activations (its parameter
                         gradients summed over the set)

With ``sequence_parallel=True``, activations outside the column/row pair are split along
dim 0 (the sequence, Megatron's [s, b, h] layout): the column layer allgathers them first
and the row layer reduce-scatters its output instead of allreducing it.

Every member of `process_set` builds the same layers in the same order and runs the same
forward and backward passes (their collectives are matched by per-layer names). Sizes that
do not divide by the set size are split as reducescatter splits rows (first members get one
extra). A layer built from sizes creates the full dense layer with torch's default
initialization and keeps its slice, so members must share the RNG state (seed them alike)
to hold slices of one model; ``from_dense`` slices an existing module instead.
"""

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from hvdlite.common import dtypes, exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch import conjugate
from hvdlite.torch.conjugate import partition

_ids = itertools.count()  # per-process layer numbering: the same on members that build alike


def _member(process_set, what):
    k, i = process_set.size(), process_set.rank()
    if i < 0:
        raise exceptions.InvalidArgumentError(
            "%s: this rank (%s) is not a member of %r" % (what, process_set.ranks, process_set)
        )
    return k, i


def _gather_param(t, dim, name, ps):
    """The full tensor from every member's block along `dim` (collective, not differentiable)."""
    with torch.no_grad():
        return conjugate.gather_now(t.detach(), dim, name, ps)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's rows (output features) split over `process_set`. The output is
    this member's feature block, or every feature with ``gather_output=True``."""

    def __init__(
        self,
        in_features,
        out_features,
        bias=True,
        gather_output=False,
        process_set=global_process_set,
        sequence_parallel=False,
        dense=None,
    ):
        super().__init__()
        if gather_output and sequence_parallel:
            raise exceptions.InvalidArgumentError(
                "ColumnParallelLinear: gather_output and sequence_parallel exclude each other"
            )
        k, i = _member(process_set, "ColumnParallelLinear")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.process_set = process_set
        self._rows = [partition(out_features, k, j)[1] for j in range(k)]
        self.start, n = partition(out_features, k, i)
        dense = dense if dense is not None else nn.Linear(in_features, out_features, bias=bias)
        self.weight = nn.Parameter(dense.weight.detach()[self.start : self.start + n].clone())
        if bias:
            self.bias = nn.Parameter(dense.bias.detach()[self.start : self.start + n].clone())
        else:
            self.register_parameter("bias", None)
        self._tag = "tp.col%d" % next(_ids)

    @classmethod
    def from_dense(cls, module, process_set=global_process_set, gather_output=False, sequence_parallel=False):
        """This member's slice of an existing nn.Linear."""
        return cls(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            gather_output=gather_output,
            process_set=process_set,
            sequence_parallel=sequence_parallel,
            dense=module,
        )

    def forward(self, x):
        ps = self.process_set
        if self.sequence_parallel:
            x = conjugate.gather_sequence(x, self._tag + ".sp", ps)
        else:
            x = conjugate.copy_to_region(x, self._tag + ".in", ps)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = conjugate.gather_from_region(y, -1, self._tag + ".out", ps, sizes=self._rows)
        return y

    def full_weight(self):
        """(weight, bias) of the whole layer, gathered (collective over the set)."""
        w = _gather_param(self.weight, 0, self._tag + ".w", self.process_set)
        b = None if self.bias is None else _gather_param(self.bias, 0, self._tag + ".b", self.process_set)
        return w, b

    def to_dense(self):
        """An nn.Linear holding the whole layer (collective over the set)."""
        return _linear(self.full_weight(), self.in_features, self.out_features)

    def extra_repr(self):
        return (
            "in_features=%d, out_features=%d (rows %d..%d here), gather_output=%s, sequence_parallel=%s"
            % (
                self.in_features,
                self.out_features,
                self.start,
                self.start + self.weight.shape[0],
                self.gather_output,
                self.sequence_parallel,
            )
        )


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's columns (input features) split over `process_set`; the partial
    products are summed over the set (reduce-scattered along the sequence with
    ``sequence_parallel=True``). The bias is whole on every member, added once."""

    def __init__(
        self,
        in_features,
        out_features,
        bias=True,
        input_is_parallel=True,
        process_set=global_process_set,
        sequence_parallel=False,
        dense=None,
    ):
        super().__init__()
        if sequence_parallel and not input_is_parallel:
            raise exceptions.InvalidArgumentError(
                "RowParallelLinear: sequence_parallel needs input_is_parallel=True"
            )
        k, i = _member(process_set, "RowParallelLinear")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.process_set = process_set
        self.start, n = partition(in_features, k, i)
        dense = dense if dense is not None else nn.Linear(in_features, out_features, bias=bias)
        self.weight = nn.Parameter(dense.weight.detach()[:, self.start : self.start + n].clone())
        if bias:
            self.bias = nn.Parameter(dense.bias.detach().clone())
        else:
            self.register_parameter("bias", None)
        self._tag = "tp.row%d" % next(_ids)

    @classmethod
    def from_dense(
        cls, module, process_set=global_process_set, input_is_parallel=True, sequence_parallel=False
    ):
        """This member's slice of an existing nn.Linear."""
        return cls(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            input_is_parallel=input_is_parallel,
            process_set=process_set,
            sequence_parallel=sequence_parallel,
            dense=module,
        )

    def forward(self, x):
        ps = self.process_set
        if not self.input_is_parallel:
            x = conjugate.scatter_to_region(x, -1, self._tag + ".in", ps)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = conjugate.reduce_scatter_sequence(y, self._tag + ".sp", ps)
            bias = None if self.bias is None else conjugate.copy_to_region(self.bias, self._tag + ".bias", ps)
        else:
            y = conjugate.reduce_from_region(y, self._tag + ".out", ps)
            bias = self.bias
        return y if bias is None else y + bias

    def full_weight(self):
        """(weight, bias) of the whole layer, gathered (collective over the set)."""
        w = _gather_param(self.weight, 1, self._tag + ".w", self.process_set)
        return w, None if self.bias is None else self.bias.detach().clone()

    def to_dense(self):
        """An nn.Linear holding the whole layer (collective over the set)."""
        return _linear(self.full_weight(), self.in_features, self.out_features)

    def extra_repr(self):
        return "in_features=%d (columns %d..%d here), out_features=%d, sequence_parallel=%s" % (
            self.in_features,
            self.start,
            self.start + self.weight.shape[1],
            self.out_features,
            self.sequence_parallel,
        )


def _linear(weight_bias, in_features, out_features):
    w, b = weight_bias
    out = nn.Linear(in_features, out_features, bias=b is not None)
    with torch.no_grad():
        out.weight.copy_(w)
        if b is not None:
            out.bias.copy_(b)
    return out


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding with the rows (vocabulary) split over `process_set`: each member looks up
    the ids in its block and the results are summed (reduce-scattered along dim 0, the
    sequence, with ``sequence_parallel=True``)."""

    def __init__(
        self,
        num_embeddings,
        embedding_dim,
        process_set=global_process_set,
        sequence_parallel=False,
        dense=None,
    ):
        super().__init__()
        k, i = _member(process_set, "VocabParallelEmbedding")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.process_set, self.sequence_parallel = process_set, sequence_parallel
        self.start, n = partition(num_embeddings, k, i)
        dense = dense if dense is not None else nn.Embedding(num_embeddings, embedding_dim)
        self.weight = nn.Parameter(dense.weight.detach()[self.start : self.start + n].clone())
        self._tag = "tp.emb%d" % next(_ids)

    @classmethod
    def from_dense(cls, module, process_set=global_process_set, sequence_parallel=False):
        """This member's rows of an existing nn.Embedding."""
        return cls(
            module.num_embeddings,
            module.embedding_dim,
            process_set=process_set,
            sequence_parallel=sequence_parallel,
            dense=module,
        )

    def forward(self, ids):
        outside = (ids < self.start) | (ids >= self.start + self.weight.shape[0])
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return conjugate.reduce_scatter_sequence(out, self._tag + ".sp", self.process_set)
        return conjugate.reduce_from_region(out, self._tag + ".out", self.process_set)

    def full_weight(self):
        """The whole embedding table, gathered (collective over the set)."""
        return _gather_param(self.weight, 0, self._tag + ".w", self.process_set)

    def to_dense(self):
        out = nn.Embedding(self.num_embeddings, self.embedding_dim)
        with torch.no_grad():
            out.weight.copy_(self.full_weight())
        return out


class SequenceParallelLayerNorm(nn.LayerNorm):
    """nn.LayerNorm for sequence-split activations: the weight and bias are whole on every
    member and their gradients are summed over the set (each member saw some of the tokens)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, process_set=global_process_set):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        _member(process_set, "SequenceParallelLayerNorm")
        self.process_set = process_set
        self._tag = "tp.ln%d" % next(_ids)

    @classmethod
    def from_dense(cls, module, process_set=global_process_set):
        out = cls(module.normalized_shape, module.eps, module.elementwise_affine, process_set=process_set)
        out.load_state_dict(module.state_dict())
        return out

    def forward(self, x):
        w, b = self.weight, self.bias
        if w is not None:
            w = conjugate.copy_to_region(w, self._tag + ".w", self.process_set)
        if b is not None:
            b = conjugate.copy_to_region(b, self._tag + ".b", self.process_set)
        return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


def vocab_parallel_cross_entropy(
    logits, target, process_set=global_process_set, ignore_index=-100, reduction="mean", name="tp.xent"
):
    """F.cross_entropy(full_logits, target) from this member's vocabulary block of the logits
    (``logits[..., V_local]``, blocks in member order as ColumnParallelLinear makes them).
    The vocabulary is never gathered: one allgather of the block sizes, one Max allreduce and
    one Sum allreduce of two numbers per token. Differentiable; collective over the set."""
    ps = process_set
    i = _member(ps, "vocab_parallel_cross_entropy")[1]
    if reduction not in ("mean", "sum", "none"):
        raise exceptions.InvalidArgumentError(
            "reduction must be 'mean', 'sum' or 'none', not %r" % (reduction,)
        )
    sizes = conjugate.sizes_now(logits, -1, name + ".sizes", ps)
    start, n = sum(sizes[:i]), sizes[i]
    with torch.no_grad():
        top = conjugate.allreduce_now(logits.max(dim=-1).values, dtypes.Max, name + ".max", ps)
    shifted = logits - top.unsqueeze(-1)
    outside = (target < start) | (target >= start + n)
    local = (target - start).masked_fill(outside, 0)
    picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    both = conjugate.reduce_from_region(torch.stack([picked, shifted.exp().sum(dim=-1)]), name + ".sum", ps)
    loss = both[1].log() - both[0]
    ignored = target == ignore_index
    loss = loss.masked_fill(ignored, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (~ignored).sum()
