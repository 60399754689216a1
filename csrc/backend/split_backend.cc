// HVDLITE_CPU_OPERATIONS=auto in a job started by mpirun: each collective goes
// to the ring or to MPI by its kind and size, on the numbers measured with
// benchmarks/_mpi_path.py (the table and its measurements are in registry.cc).
// Every member picks the same backend: the size deciding it agrees across
// members (alltoall, whose per-member sizes do not, decides by kind alone).
#include "backend/split_backend.h"

namespace hvdlite {
namespace {

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

int64_t Bytes(const Reduction& r, int64_t count) {
  return count * static_cast<int64_t>(DataTypeSize(r.dtype));
}

class SplitBackend : public Backend {
 public:
  SplitBackend(std::unique_ptr<Backend> ring, std::unique_ptr<Backend> mpi, const AutoTable& table)
      : ring_(std::move(ring)), mpi_(std::move(mpi)), table_(table) {}
  const char* name() const override { return "auto"; }
  std::string Describe(Collective c, int64_t bytes, int members) const override {
    return Pick(c, bytes)->Describe(c, bytes, members);
  }

  Status Allreduce(const CollectiveContext& ctx, const AllreduceOptions& o) override {
    return Pick(Collective::kAllreduce, Bytes(o, o.count))->Allreduce(ctx, o);
  }
  bool AllreduceIsRecursiveDoubling(int64_t bytes, int members) const override {
    return Pick(Collective::kAllreduce, bytes)->AllreduceIsRecursiveDoubling(bytes, members);
  }
  Status Allgatherv(const CollectiveContext& ctx, const AllgathervOptions& o) override {
    return Pick(Collective::kAllgather, Sum(o.bytes))->Allgatherv(ctx, o);
  }
  Status Broadcast(const CollectiveContext& ctx, const BroadcastOptions& o) override {
    return Pick(Collective::kBroadcast, o.bytes)->Broadcast(ctx, o);
  }
  Status Alltoallv(const CollectiveContext& ctx, const AlltoallvOptions& o) override {
    return Pick(Collective::kAlltoall, 0)->Alltoallv(ctx, o);
  }
  Status ReduceScatter(const CollectiveContext& ctx, const ReduceScatterOptions& o) override {
    return Pick(Collective::kReducescatter, Bytes(o, Sum(o.counts)))->ReduceScatter(ctx, o);
  }
  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override {
    HVD_RETURN_IF_ERROR(ring_->AddProcessSet(id, ranks));
    return mpi_->AddProcessSet(id, ranks);
  }
  void RemoveProcessSet(int32_t id) override {
    ring_->RemoveProcessSet(id);
    mpi_->RemoveProcessSet(id);
  }

 private:
  Backend* Pick(Collective c, int64_t bytes) const {
    return table_.UsesMpi(c, bytes) ? mpi_.get() : ring_.get();
  }

  std::unique_ptr<Backend> ring_, mpi_;
  AutoTable table_;
};

}  // namespace

std::unique_ptr<Backend> NewSplitBackend(std::unique_ptr<Backend> ring, std::unique_ptr<Backend> mpi,
                                         const AutoTable& table) {
  return std::unique_ptr<Backend>(new SplitBackend(std::move(ring), std::move(mpi), table));
}

}  // namespace hvdlite
