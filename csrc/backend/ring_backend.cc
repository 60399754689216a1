// The native backend: the algorithms of csrc/algorithms over the Transport.
#include "algorithms/algorithms.h"
#include "algorithms/reduce_kernels.h"
#include "backend/backend.h"

namespace hvdlite {
namespace {

class RingBackend : public Backend {
 public:
  explicit RingBackend(Transport* t) : transport_(t) {}
  const char* name() const override { return "ring"; }

  std::string Describe(Collective c, int64_t bytes, int members) const override {
    return std::string("ring/") + AlgorithmName(Choice(c, bytes, members));
  }

  Status Allreduce(const CollectiveContext& ctx, const AllreduceOptions& o) override {
    HVD_RETURN_IF_ERROR(ScaleBuffer(o.buf, o.count, o.dtype, o.prescale));
    return hvdlite::Allreduce(Group(ctx, transport_), o.buf, o.count, o.dtype, o.op, o.postscale);
  }
  Status Allgatherv(const CollectiveContext& ctx, const AllgathervOptions& o) override {
    return hvdlite::Allgatherv(Group(ctx, transport_), o.send, o.recv, o.bytes);
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
  std::vector<char> scratch_;  // a prescaled reducescatter input
};

}  // namespace

std::unique_ptr<Backend> NewRingBackend(Transport* transport) {
  return std::unique_ptr<Backend>(new RingBackend(transport));
}

}  // namespace hvdlite
