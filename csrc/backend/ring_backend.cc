// The native backend: the algorithms of csrc/algorithms over the Transport.
#include "algorithms/algorithms.h"
#include "backend/backend.h"

namespace hvdlite {
namespace {

class RingBackend : public Backend {
 public:
  explicit RingBackend(Transport* t) : transport_(t) {}
  const char* name() const override { return "ring"; }

  std::string Describe(Collective c, int64_t bytes, int members) const override {
    switch (c) {
      case Collective::kAllreduce:
        return std::string("ring/") + AllreduceAlgorithm(bytes, members);
      case Collective::kBroadcast:
        return std::string("ring/") + BroadcastAlgorithm(bytes, members);
      case Collective::kAllgather:
        return "ring/ring_allgatherv";
      case Collective::kAlltoall:
        return "ring/pairwise_exchange";
      case Collective::kReducescatter:
        return "ring/ring_reduce_scatter";
    }
    return "ring";
  }

  Status Allreduce(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                   ReduceOp op) override {
    return hvdlite::Allreduce(ToGroup(ctx), buf, count, dtype, op);
  }
  Status AllreduceAndScale(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                           ReduceOp op, double postscale) override {
    return hvdlite::Allreduce(ToGroup(ctx), buf, count, dtype, op, postscale);
  }
  Status Allgatherv(const CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<int64_t>& bytes) override {
    return hvdlite::Allgatherv(ToGroup(ctx), send, recv, bytes);
  }
  Status Broadcast(const CollectiveContext& ctx, void* buf, int64_t len, int root_member) override {
    return hvdlite::Broadcast(ToGroup(ctx), buf, len, root_member);
  }
  Status Alltoallv(const CollectiveContext& ctx, const void* send, const std::vector<int64_t>& send_bytes,
                   void* recv, const std::vector<int64_t>& recv_bytes) override {
    return hvdlite::Alltoallv(ToGroup(ctx), send, send_bytes, recv, recv_bytes);
  }
  Status ReduceScatter(const CollectiveContext& ctx, void* buf, const std::vector<int64_t>& counts, void* out,
                       DataType dtype, ReduceOp op) override {
    return hvdlite::ReduceScatter(ToGroup(ctx), buf, counts, out, dtype, op);
  }

 private:
  Group ToGroup(const CollectiveContext& ctx) const {
    Group g;
    g.transport = transport_;
    g.ranks = ctx.ranks;
    g.me = ctx.me;
    g.tag = ctx.tag;
    return g;
  }
  Transport* transport_;
};

}  // namespace

std::unique_ptr<Backend> NewRingBackend(Transport* transport) {
  return std::unique_ptr<Backend>(new RingBackend(transport));
}

}  // namespace hvdlite
