// The native backend: the algorithms of csrc/algorithms over the Transport.
//
// Allreduce across hosts may run in two levels (hierarchical.h): every host's
// members reduce-scatter the buffer into local_size blocks (shared memory), the
// members holding block i on every host allreduce it among themselves (one
// cross-host ring per local rank, in parallel, each with 1/local_size of the
// bytes), and every host allgathers its blocks; the three phases are pipelined
// over chunks of the buffer. Each block is computed once, by its cross group,
// so every member ends with the same bits. Allgatherv across hosts may run in
// two levels too (HierarchicalAllgatherv) when every host holds consecutive
// members; otherwise, and for a layout SplitByHost rejects, one flat ring.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/reduce_kernels.h"
#include "algorithms/ring.h"
#include "backend/backend.h"
#include "backend/hierarchical.h"
#include "common/logging.h"

namespace hvdlite {
namespace {

constexpr int64_t kHierarchicalMinBytes = 1 << 20;  // HIERARCHICAL_ALLREDUCE/ALLGATHER=-1: from here on

// Splits g into this member's host group and its cross group (the members with
// the same index inside their hosts, one per host). False when g is on one host,
// a host holds a single member, or the hosts hold different numbers of members.
bool SplitByHost(const Group& g, const std::vector<int>& host_of, Group* local, Group* cross) {
  std::vector<int> hosts;                  // host indices, by first appearance in g
  std::vector<std::vector<int>> per_host;  // global ranks of g on each of them, ascending
  for (int r : g.ranks) {
    if (r < 0 || r >= static_cast<int>(host_of.size())) return false;
    auto it = std::find(hosts.begin(), hosts.end(), host_of[r]);
    if (it == hosts.end()) {
      hosts.push_back(host_of[r]);
      per_host.emplace_back();
      it = hosts.end() - 1;
    }
    per_host[it - hosts.begin()].push_back(r);
  }
  if (hosts.size() < 2 || per_host[0].size() < 2) return false;
  for (const auto& members : per_host)
    if (members.size() != per_host[0].size()) return false;
  const int me = g.peer(g.me);
  const size_t h = std::find(hosts.begin(), hosts.end(), host_of[me]) - hosts.begin();
  const int li =
      static_cast<int>(std::find(per_host[h].begin(), per_host[h].end(), me) - per_host[h].begin());
  *local = g;
  local->ranks = per_host[h];
  local->me = li;
  *cross = g;
  cross->ranks.clear();
  for (const auto& members : per_host) cross->ranks.push_back(members[li]);
  std::sort(cross->ranks.begin(), cross->ranks.end());
  cross->me =
      static_cast<int>(std::find(cross->ranks.begin(), cross->ranks.end(), me) - cross->ranks.begin());
  return true;
}

// True when `local` (from SplitByHost) sits at members [h * L, h * L + L) of g
// for every host h: the flat member order is host-major, as
// HierarchicalAllgatherv needs.
bool HostsContiguous(const Group& g, const std::vector<int>& host_of, int L) {
  for (int i = 0; i < g.size(); ++i) {
    if (host_of[g.peer(i)] != host_of[g.peer(i - i % L)]) return false;
  }
  return true;
}

class RingBackend : public Backend {
 public:
  RingBackend(Transport* t, std::vector<int> host_of, int hierarchical, int hierarchical_allgather)
      : transport_(t),
        host_of_(std::move(host_of)),
        hierarchical_(hierarchical),
        hierarchical_allgather_(hierarchical_allgather) {}
  const char* name() const override { return "ring"; }

  std::string Describe(Collective c, int64_t bytes, int members) const override {
    return std::string("ring/") + AlgorithmName(Choice(c, bytes, members));
  }

  Status Allreduce(const CollectiveContext& ctx, const AllreduceOptions& o) override {
    HVD_RETURN_IF_ERROR(ScaleBuffer(o.buf, o.count, o.dtype, o.prescale));
    const Group g(ctx, transport_);
    const int64_t bytes = o.count * static_cast<int64_t>(DataTypeSize(o.dtype));
    Group local, cross;
    if ((hierarchical_ > 0 || (hierarchical_ < 0 && bytes >= kHierarchicalMinBytes)) &&
        SplitByHost(g, host_of_, &local, &cross)) {
      if (!logged_two_level_) {
        logged_two_level_ = true;
        HVD_LOG(kDebug, "allreduce in two levels: " << cross.size() << " hosts x " << local.size()
                                                    << " ranks (first: " << bytes << " bytes)");
      }
      return PipelinedHierarchicalAllreduce(local, cross, o.buf, o.count, o.dtype, o.op, o.postscale);
    }
    return hvdlite::Allreduce(g, o.buf, o.count, o.dtype, o.op, o.postscale);
  }
  bool AllreduceIsRecursiveDoubling(int64_t bytes, int members) const override {
    return hierarchical_ <= 0 && bytes < kHierarchicalMinBytes &&
           AllreduceAlgorithm(bytes, members) == Algorithm::kRecursiveDoubling;
  }
  Status Allgatherv(const CollectiveContext& ctx, const AllgathervOptions& o) override {
    const Group g(ctx, transport_);
    int64_t total = 0;
    for (int64_t b : o.bytes) total += b;
    Group local, cross;
    if (static_cast<int>(o.bytes.size()) == g.size() &&
        (hierarchical_allgather_ > 0 || (hierarchical_allgather_ < 0 && total >= kHierarchicalMinBytes)) &&
        SplitByHost(g, host_of_, &local, &cross) && HostsContiguous(g, host_of_, local.size())) {
      if (!logged_two_level_allgather_) {
        logged_two_level_allgather_ = true;
        HVD_LOG(kDebug, "allgather in two levels: " << cross.size() << " hosts x " << local.size()
                                                    << " ranks (first: " << total << " bytes)");
      }
      return HierarchicalAllgatherv(local, cross, o.send, o.recv, o.bytes);
    }
    return hvdlite::Allgatherv(g, o.send, o.recv, o.bytes);
  }
  Status Broadcast(const CollectiveContext& ctx, const BroadcastOptions& o) override {
    return hvdlite::Broadcast(Group(ctx, transport_), o.buf, o.bytes, o.root_member);
  }
  Status Alltoallv(const CollectiveContext& ctx, const AlltoallvOptions& o) override {
    return hvdlite::Alltoallv(Group(ctx, transport_), o.send, o.send_bytes, o.recv, o.recv_bytes);
  }
  Status ReduceScatter(const CollectiveContext& ctx, const ReduceScatterOptions& o) override {
    const void* in = nullptr;
    HVD_RETURN_IF_ERROR(PrescaledInput(o, &scratch_, &in));
    HVD_RETURN_IF_ERROR(hvdlite::ReduceScatter(Group(ctx, transport_), in, o.counts, o.out, o.dtype, o.op));
    return ScaleBuffer(o.out, o.counts[ctx.me], o.dtype, o.postscale);
  }

 private:
  static Algorithm Choice(Collective c, int64_t bytes, int members) {
    switch (c) {
      case Collective::kAllreduce:
        return AllreduceAlgorithm(bytes, members);
      case Collective::kBroadcast:
        return BroadcastAlgorithm(bytes, members);
      case Collective::kAllgather:
        return Algorithm::kRingAllgatherv;
      case Collective::kAlltoall:
        return Algorithm::kPairwiseExchange;
      case Collective::kReducescatter:
        return Algorithm::kRingReduceScatter;
    }
    return Algorithm::kRing;
  }

  Transport* transport_;
  std::vector<int> host_of_;    // Topology::host_of
  int hierarchical_;            // HVDLITE_HIERARCHICAL_ALLREDUCE: 1 on, 0 off, -1 by size
  int hierarchical_allgather_;  // HVDLITE_HIERARCHICAL_ALLGATHER: the same
  bool logged_two_level_ = false;
  bool logged_two_level_allgather_ = false;
  std::vector<char> scratch_;  // a prescaled reducescatter input
};

}  // namespace

std::unique_ptr<Backend> NewRingBackend(Transport* transport, std::vector<int> host_of, int hierarchical,
                                        int hierarchical_allgather) {
  return std::unique_ptr<Backend>(
      new RingBackend(transport, std::move(host_of), hierarchical, hierarchical_allgather));
}

}  // namespace hvdlite
