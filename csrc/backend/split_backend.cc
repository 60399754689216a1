// HVDLITE_CPU_OPERATIONS=auto in a job started by mpirun: each collective goes
// to the backend that is faster for its size on the numbers measured with
// benchmarks/_mpi_path.py (docs/mpi_and_cuda.md): the native ring below
// `threshold` bytes, where the two are within noise of each other, MPI at and
// above it, where Open MPI's shared-memory path is 1.1-5x faster.
// Every member picks the same backend: the size deciding it agrees across
// members (alltoall, whose sizes do not, always uses the large-message one).
#include "backend/backend.h"

namespace hvdlite {
namespace {

class SplitBackend : public Backend {
 public:
  SplitBackend(std::unique_ptr<Backend> small, std::unique_ptr<Backend> large, int64_t threshold)
      : small_(std::move(small)), large_(std::move(large)), threshold_(threshold) {}
  const char* name() const override { return "auto"; }
  std::string Describe(Collective c, int64_t bytes, int members) const override {
    return (c == Collective::kAlltoall ? large_.get() : Pick(bytes))->Describe(c, bytes, members);
  }

  Status Allreduce(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                   ReduceOp op) override {
    return Pick(count * static_cast<int64_t>(DataTypeSize(dtype)))->Allreduce(ctx, buf, count, dtype, op);
  }
  Status Allgatherv(const CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<int64_t>& bytes) override {
    return Pick(Sum(bytes))->Allgatherv(ctx, send, recv, bytes);
  }
  Status Broadcast(const CollectiveContext& ctx, void* buf, int64_t len, int root_member) override {
    return Pick(len)->Broadcast(ctx, buf, len, root_member);
  }
  Status Alltoallv(const CollectiveContext& ctx, const void* send, const std::vector<int64_t>& send_bytes,
                   void* recv, const std::vector<int64_t>& recv_bytes) override {
    return large_->Alltoallv(ctx, send, send_bytes, recv, recv_bytes);
  }
  Status ReduceScatter(const CollectiveContext& ctx, void* buf, const std::vector<int64_t>& counts, void* out,
                       DataType dtype, ReduceOp op) override {
    return Pick(Sum(counts) * static_cast<int64_t>(DataTypeSize(dtype)))
        ->ReduceScatter(ctx, buf, counts, out, dtype, op);
  }
  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override {
    HVD_RETURN_IF_ERROR(small_->AddProcessSet(id, ranks));
    return large_->AddProcessSet(id, ranks);
  }
  void RemoveProcessSet(int32_t id) override {
    small_->RemoveProcessSet(id);
    large_->RemoveProcessSet(id);
  }

 private:
  static int64_t Sum(const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v) s += x;
    return s;
  }
  Backend* Pick(int64_t bytes) const { return bytes >= threshold_ ? large_.get() : small_.get(); }

  std::unique_ptr<Backend> small_, large_;
  int64_t threshold_;
};

}  // namespace

std::unique_ptr<Backend> NewSplitBackend(std::unique_ptr<Backend> small, std::unique_ptr<Backend> large,
                                         int64_t threshold_bytes) {
  return std::unique_ptr<Backend>(new SplitBackend(std::move(small), std::move(large), threshold_bytes));
}

}  // namespace hvdlite
