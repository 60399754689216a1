"""Mixture of Experts with expert parallelism (``hvd.parallel.MoE``), built only on
hvdlite.torch's public collectives (alltoall with splits, allreduce, allgather).

Layout: the `num_experts` experts are split in contiguous blocks over the expert-parallel
set (``process_set``, e.g. ``mesh.process_set("ep")``): member i holds experts
[i*L, (i+1)*L), L = num_experts / set size. Every member routes its own tokens; a token's
rows travel to the members holding its chosen experts and back. Per forward: an allgather of
routing counts and an allreduce of router sums (statistics set), an alltoall of per-expert
row counts, then the dispatch and combine alltoalls with splits; per backward: the two
data alltoalls reversed, and the allreduce of the router sums' gradient.

Decisions that must not depend on the layout are taken on statistics reduced over the
*statistics set* (``stats_process_set``; default ``process_set``; with data parallelism
``mesh.process_set(("dp", "ep"))``): the global token order is the members' tokens
concatenated in set-rank order, so one process holding every token (in that order) and
every expert computes the same outputs, auxiliary loss and dropped tokens.

Contract: collective. Every member of ``process_set`` and of ``stats_process_set`` must call
the layer the same number of times in the same order (also in backward: they all
backpropagate through it, or none does), with inputs of the same hidden size and dtype;
the number of tokens may differ, and may be zero. Each call blocks on its collectives.
"""

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from hvdlite.common import exceptions
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch import conjugate
from hvdlite.torch.parallel.moe import experts as moe_experts

_LAYER_IDS = itertools.count()


class MoE(nn.Module):
    """hvd.parallel.MoE(hidden_size, expert=factory, num_experts=8, k=1, capacity_factor=1.25,
    min_capacity=4, drop_tokens=True, aux_loss_coef=0.01, z_loss_coef=0.0,
    process_set=global_process_set, expert_dp_process_set=None, stats_process_set=None,
    name=None, batch_experts=None)

    ``out, aux_loss, expert_counts = moe(x)`` with x [..., hidden_size]: out has x's leading
    shape; aux_loss is a scalar, the same on every member (add it to every member's loss);
    expert_counts [num_experts] (int64) are the tokens each expert processed in the global
    batch, after dropping.

    - ``expert``: a callable returning one expert module ([n, hidden] -> [n, out]). Expert g
      (global index) is built under ``torch.manual_seed(base + g)``, base drawn once from
      torch's generator (the same draw on every layout), so under the same seed any ep size
      holds identical experts. The gate (``moe.gate``, a bias-free Linear) is built first from
      torch's generator.
    - Router: softmax over the experts in float32, top-k (k >= 1); for k > 1 the k weights are
      renormalised to sum to 1 (before dropping; a dropped assignment contributes nothing).
    - Capacity (``drop_tokens=True``): each expert takes at most
      C = max(min_capacity, ceil(capacity_factor * N * k / num_experts)) assignments of the N
      global tokens, by priority: all first choices in global token order, then all second
      choices, and so on. ``drop_tokens=False``: dropless, variable-size all-to-all.
    - Losses: aux_loss = aux_loss_coef * E * sum_e f_e P_e (Switch; f_e = share of the N*k
      assignments, before dropping, routed to e; P_e = mean router probability of e) plus
      z_loss_coef * mean(logsumexp(logits)^2), all over the global batch. Their gradient is
      that of the loss computed once: with gradients averaged over the statistics set (as
      DistributedOptimizer does), every member adding aux_loss gives the exact gradient.
    - Expert parameters are marked ``p.hvd_process_set = expert_dp_process_set`` (None: this
      member alone), which DistributedOptimizer honours: see hvdlite/torch/optimizer.py.
    - A member's L local experts run as one batched computation (torch.func.vmap of
      functional_call over their stacked parameters, on the rows padded to
      [L, max rows, hidden]; see experts.py) when L > 1 and ``batch_experts`` allows:
      None (default) batches experts built only from row-wise torch modules
      (moe_experts.ROWWISE_MODULES: Sequential, Linear, LayerNorm, activations), True
      batches any experts of identical structure (you assert they are row-wise, pure and
      vmap-able), False never. Otherwise they run in a loop over the modules (an expert
      with zero rows still runs, so its gradients are zeros rather than None; the batched
      path gives zeros too). ``moe.expert_runs`` counts the forwards of each path.
    """

    def __init__(
        self,
        hidden_size,
        expert,
        num_experts=8,
        k=1,
        capacity_factor=1.25,
        min_capacity=4,
        drop_tokens=True,
        aux_loss_coef=0.01,
        z_loss_coef=0.0,
        process_set=global_process_set,
        expert_dp_process_set=None,
        stats_process_set=None,
        name=None,
        batch_experts=None,
    ):
        super().__init__()
        ep = process_set.size()
        if num_experts < 1 or num_experts % ep:
            raise exceptions.InvalidArgumentError(
                "MoE: num_experts=%d must be a positive multiple of the expert-parallel set's "
                "size %d" % (num_experts, ep)
            )
        if not 1 <= k <= num_experts:
            raise exceptions.InvalidArgumentError(
                "MoE: k=%d must be in [1, num_experts=%d]" % (k, num_experts)
            )
        self.hidden_size, self.num_experts, self.k = hidden_size, num_experts, k
        self.capacity_factor, self.min_capacity, self.drop_tokens = capacity_factor, min_capacity, drop_tokens
        self.aux_loss_coef, self.z_loss_coef = aux_loss_coef, z_loss_coef
        self.process_set = process_set
        self.stats_process_set = stats_process_set if stats_process_set is not None else process_set
        self.expert_dp_process_set = expert_dp_process_set
        self.name = name if name is not None else "moe%d" % next(_LAYER_IDS)
        self.num_local_experts = num_experts // ep
        self.first_expert = process_set.rank() * self.num_local_experts
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        base = int(torch.randint(0, 2**62, (1,)).item())
        experts = []
        for g in range(self.first_expert, self.first_expert + self.num_local_experts):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(base + g)
                experts.append(expert())
        self.experts = nn.ModuleList(experts)
        self.batch_experts = batch_experts
        self.expert_runs = {"batched": 0, "loop": 0}  # forwards that took each path
        for p in self.experts.parameters():
            p.hvd_process_set = expert_dp_process_set  # type: ignore[attr-defined]

    def capacity(self, num_tokens):
        """Assignments each expert takes out of `num_tokens` global tokens (None: dropless)."""
        if not self.drop_tokens:
            return None
        return max(
            self.min_capacity, math.ceil(self.capacity_factor * num_tokens * self.k / self.num_experts)
        )

    def forward(self, x):
        lead = x.shape[:-1]
        h = x.reshape(-1, self.hidden_size)
        route = self._route(h)
        out = self._dispatch_combine(h, route)
        return out.reshape(*lead, *out.shape[1:]), route["aux"], route["expert_counts"]

    def _route(self, h):
        """Gating, global statistics, capacity and the auxiliary losses (see the class doc)."""
        E, k, sps = self.num_experts, self.k, self.stats_process_set
        logits = self.gate(h).float()
        probs = torch.softmax(logits, dim=-1)
        top_p, top_i = probs.topk(k, dim=-1)
        weights = top_p / top_p.sum(dim=-1, keepdim=True) if k > 1 else top_p
        counts = torch.stack([torch.bincount(top_i[:, s], minlength=E) for s in range(k)])  # [k, E]
        every = conjugate.gather_now(counts.reshape(1, k * E), 0, self.name + ".counts", sps).reshape(
            -1, k, E
        )
        total = every.sum(dim=0)  # [k, E]
        n_global = int(total[0].sum())
        cap = self.capacity(n_global)
        keep = torch.ones_like(top_i, dtype=torch.bool)
        if cap is not None:
            # Priority: slot-major, then global token order (members in set-rank order).
            before = total.cumsum(dim=0) - total + every[: sps.rank()].sum(dim=0)  # [k, E]
            for s in range(k):
                onehot = F.one_hot(top_i[:, s], E)
                local = (onehot.cumsum(dim=0) - 1).gather(1, top_i[:, s : s + 1]).squeeze(1)
                keep[:, s] = before[s].gather(0, top_i[:, s]) + local < cap
        per_expert = total.sum(dim=0)
        expert_counts = per_expert if cap is None else per_expert.clamp(max=cap)
        return {
            "experts": top_i,
            "weights": weights,
            "keep": keep,
            "aux": self._aux_loss(logits, probs, per_expert, n_global),
            "expert_counts": expert_counts,
        }

    def _aux_loss(self, logits, probs, per_expert, n_global):
        if not (self.aux_loss_coef or self.z_loss_coef) or n_global == 0:
            return torch.zeros((), dtype=torch.float32)
        z_local = torch.logsumexp(logits, dim=-1).square().sum().reshape(1)
        sums = conjugate.sum_everywhere(
            torch.cat([probs.sum(dim=0), z_local]), self.name + ".stats", self.stats_process_set
        )
        E = self.num_experts
        balance = (sums[:E] * per_expert.float()).sum() * (E / (n_global * n_global * self.k))
        return self.aux_loss_coef * balance + self.z_loss_coef * sums[E] / n_global

    def _dispatch_combine(self, h, route):
        """Sends each kept (token, expert) assignment's row to the expert's member, runs the
        local experts, sends the results back and sums them weighted per token."""
        E, L, ps = self.num_experts, self.num_local_experts, self.process_set
        members = ps.size()
        T = h.shape[0]
        experts, weights, keep = route["experts"], route["weights"], route["keep"]
        token = torch.arange(T).unsqueeze(1).expand(T, self.k)[keep]
        expert = experts[keep]
        weight = weights[keep]
        order = torch.sort(expert, stable=True).indices  # expert-major, then token, then slot
        token, expert, weight = token[order], expert[order], weight[order]
        send = torch.bincount(expert, minlength=E)  # [E]: rows for each expert
        recv, _ = conjugate.exchange(send, [L] * members, self.name + ".sizes", ps)
        recv = recv.reshape(members, L)  # rows from member q for local expert l
        rows = conjugate.all_to_all(
            h[token], send.reshape(members, L).sum(dim=1).tolist(), self.name + ".dispatch", ps
        )
        local = list(self.experts)
        if moe_experts.batchable(local, self.batch_experts):
            self.expert_runs["batched"] += 1
            done = moe_experts.run_batched(local, rows, recv)
        else:
            self.expert_runs["loop"] += 1
            done = moe_experts.run_loop(local, rows, recv)
        returned = conjugate.all_to_all(done, recv.sum(dim=1).tolist(), self.name + ".combine", ps)
        scaled = returned * weight.to(returned.dtype).unsqueeze(1)
        out = returned.new_zeros((T, *returned.shape[1:]))
        return out.index_add(0, token, scaled)


def expert_parameters(module):
    """The parameters of `module` that MoE layers marked as expert parameters."""
    return [p for p in module.parameters() if hasattr(p, "hvd_process_set")]
