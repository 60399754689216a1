// The mpi backend: CPU collectives through the MPI C API.
//
// Contracts beyond backend.h:
//  * The hvdlite job is MPI_COMM_WORLD (same ranks, same size); process set 0
//    runs on a private duplicate of it, every other set on a communicator
//    split from that duplicate when the set is added (member index = rank in
//    the communicator, since members are ascending global ranks).
//  * Results are bitwise identical on every member: built-in ops through
//    MPI_Allreduce (MPI computes one result per element and Open MPI's
//    algorithms hand every rank the same bits); float16/bfloat16, whose ops
//    are user-defined, through reduce-scatter then allgather, so each element
//    is reduced on exactly one rank and copied to the others.
//  * Counts beyond MPI's int are handled by chunking or by simpler fallbacks
//    (per-member broadcasts / reductions, pairwise exchanges).
//  * Errors return (MPI_ERRORS_RETURN on our communicators). A dead peer is
//    normally handled by mpirun, which ends the whole job.
#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

#include "algorithms/reduce_kernels.h"
#include "backend/backend.h"
#include "backend/mpi/mpi_types.h"
#include "backend/mpi/mpi_world.h"
#include "transport/transport.h"

namespace hvdlite {
namespace {

constexpr int64_t kMaxChunk = 1 << 30;  // elements or bytes per MPI call

bool FitsInt(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total <= INT_MAX;
}

void IntCountsAndDispls(const std::vector<int64_t>& v, std::vector<int>* counts, std::vector<int>* displs) {
  counts->resize(v.size());
  displs->resize(v.size());
  int64_t off = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    (*counts)[i] = static_cast<int>(v[i]);
    (*displs)[i] = static_cast<int>(off);
    off += v[i];
  }
}

class MpiBackend : public Backend {
 public:
  explicit MpiBackend(MPI_Comm world) { comms_[0] = world; }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& kv : comms_) MPI_Comm_free(&kv.second);
  }
  const char* name() const override { return "mpi"; }
  std::string Describe(Collective c, int64_t bytes, int members) const override {
    switch (c) {  // MPI picks its own algorithm inside these calls
      case Collective::kAllreduce:
        return "mpi/MPI_Allreduce";  // float16/bfloat16: reduce-scatter + allgatherv
      case Collective::kAllgather:
        return "mpi/MPI_Allgatherv";
      case Collective::kBroadcast:
        return "mpi/MPI_Bcast";
      case Collective::kAlltoall:
        return "mpi/MPI_Alltoallv";
      case Collective::kReducescatter:
        return "mpi/MPI_Reduce_scatter";
    }
    return "mpi";
  }

  Status Allreduce(const CollectiveContext& ctx, const AllreduceOptions& o) override;
  Status Allgatherv(const CollectiveContext& ctx, const AllgathervOptions& o) override;
  Status Broadcast(const CollectiveContext& ctx, const BroadcastOptions& o) override;
  Status Alltoallv(const CollectiveContext& ctx, const AlltoallvOptions& o) override;
  Status ReduceScatter(const CollectiveContext& ctx, const ReduceScatterOptions& o) override;
  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override;
  void RemoveProcessSet(int32_t id) override;

 private:
  Status Comm(const CollectiveContext& ctx, MPI_Comm* out) const;
  Status AllreduceUnscaled(MPI_Comm comm, const CollectiveContext& ctx, const AllreduceOptions& o);
  Status ReduceScatterUnscaled(MPI_Comm comm, const CollectiveContext& ctx, const ReduceScatterOptions& o,
                               const void* in);
  Status SplitAllreduce(MPI_Comm comm, const CollectiveContext& ctx, char* buf, int64_t count, DataType dtype,
                        MPI_Op op);
  Status BroadcastBytes(MPI_Comm comm, char* buf, int64_t len, int root);
  Status PairwiseAlltoallv(MPI_Comm comm, const CollectiveContext& ctx, const char* send,
                           const std::vector<int64_t>& send_bytes, char* recv,
                           const std::vector<int64_t>& recv_bytes);

  std::map<int32_t, MPI_Comm> comms_;  // process set id -> communicator (members only)
  std::vector<char> scratch_;
  std::vector<char> prescaled_;  // a prescaled reducescatter input
};

Status MpiBackend::Comm(const CollectiveContext& ctx, MPI_Comm* out) const {
  auto it = comms_.find(ctx.process_set);
  if (it == comms_.end()) {
    return Status::Internal("the mpi backend has no communicator for process set " +
                            std::to_string(ctx.process_set));
  }
  *out = it->second;
  return Status::OK();
}

Status MpiBackend::Allreduce(const CollectiveContext& ctx, const AllreduceOptions& o) {
  MPI_Comm comm;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  HVD_RETURN_IF_ERROR(ScaleBuffer(o.buf, o.count, o.dtype, o.prescale));
  HVD_RETURN_IF_ERROR(AllreduceUnscaled(comm, ctx, o));
  return ScaleBuffer(o.buf, o.count, o.dtype, o.postscale);
}

Status MpiBackend::AllreduceUnscaled(MPI_Comm comm, const CollectiveContext& ctx, const AllreduceOptions& o) {
  const DataType dtype = o.dtype;
  const int64_t count = o.count;
  MPI_Op mop;
  HVD_RETURN_IF_ERROR(ToMpiOp(dtype, o.op, &mop));
  char* p = static_cast<char*>(o.buf);
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  if (UsesUserOp(dtype)) return SplitAllreduce(comm, ctx, p, count, dtype, mop);
  for (int64_t done = 0; done < count; done += kMaxChunk) {  // count agrees on every member
    int n = static_cast<int>(std::min(kMaxChunk, count - done));
    HVD_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, p + done * esize, n, ToMpiType(dtype), mop, comm));
  }
  return Status::OK();
}

// Reduce-scatter into scratch, then allgather back into buf: every element
// is reduced once, on one rank, so all ranks end with the same bits.
Status MpiBackend::SplitAllreduce(MPI_Comm comm, const CollectiveContext& ctx, char* buf, int64_t count,
                                  DataType dtype, MPI_Op op) {
  const int n = static_cast<int>(ctx.ranks.size());
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  const MPI_Datatype type = ToMpiType(dtype);
  std::vector<int> counts(n), displs(n);
  for (int64_t done = 0; done < count; done += kMaxChunk) {
    const int64_t chunk = std::min(kMaxChunk, count - done);
    int off = 0;
    for (int i = 0; i < n; ++i) {
      counts[i] = static_cast<int>(chunk / n + (i < chunk % n ? 1 : 0));
      displs[i] = off;
      off += counts[i];
    }
    if (scratch_.size() < static_cast<size_t>(counts[0] * esize)) scratch_.resize(counts[0] * esize);
    char* p = buf + done * esize;
    HVD_MPI_CALL(MPI_Reduce_scatter(p, scratch_.data(), counts.data(), type, op, comm));
    HVD_MPI_CALL(
        MPI_Allgatherv(scratch_.data(), counts[ctx.me], type, p, counts.data(), displs.data(), type, comm));
  }
  return Status::OK();
}

Status MpiBackend::Allgatherv(const CollectiveContext& ctx, const AllgathervOptions& o) {
  MPI_Comm comm;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  const std::vector<int64_t>& bytes = o.bytes;
  const void* send = o.send;
  char* out = static_cast<char*>(o.recv);
  int64_t mine_at = 0;
  for (int i = 0; i < ctx.me; ++i) mine_at += bytes[i];
  if (FitsInt(bytes)) {
    std::vector<int> counts, displs;
    IntCountsAndDispls(bytes, &counts, &displs);
    const bool in_place = static_cast<const char*>(send) == out + mine_at;
    const void* src = in_place ? MPI_IN_PLACE : send;
    HVD_MPI_CALL(
        MPI_Allgatherv(src, counts[ctx.me], MPI_BYTE, out, counts.data(), displs.data(), MPI_BYTE, comm));
    return Status::OK();
  }
  // Beyond int displacements: every member broadcasts its own block.
  if (static_cast<const char*>(send) != out + mine_at && bytes[ctx.me] > 0)
    std::memcpy(out + mine_at, send, bytes[ctx.me]);
  int64_t off = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    HVD_RETURN_IF_ERROR(BroadcastBytes(comm, out + off, bytes[i], static_cast<int>(i)));
    off += bytes[i];
  }
  return Status::OK();
}

Status MpiBackend::BroadcastBytes(MPI_Comm comm, char* buf, int64_t len, int root) {
  for (int64_t done = 0; done < len; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, len - done));
    HVD_MPI_CALL(MPI_Bcast(buf + done, n, MPI_BYTE, root, comm));
  }
  return Status::OK();
}

Status MpiBackend::Broadcast(const CollectiveContext& ctx, const BroadcastOptions& o) {
  MPI_Comm comm;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  return BroadcastBytes(comm, static_cast<char*>(o.buf), o.bytes, o.root_member);
}

Status MpiBackend::Alltoallv(const CollectiveContext& ctx, const AlltoallvOptions& o) {
  MPI_Comm comm;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  const void* send = o.send;
  void* recv = o.recv;
  const std::vector<int64_t>& send_bytes = o.send_bytes;
  const std::vector<int64_t>& recv_bytes = o.recv_bytes;
  if (!FitsInt(send_bytes) || !FitsInt(recv_bytes)) {
    return PairwiseAlltoallv(comm, ctx, static_cast<const char*>(send), send_bytes, static_cast<char*>(recv),
                             recv_bytes);
  }
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  IntCountsAndDispls(send_bytes, &scounts, &sdispls);
  IntCountsAndDispls(recv_bytes, &rcounts, &rdispls);
  HVD_MPI_CALL(MPI_Alltoallv(send, scounts.data(), sdispls.data(), MPI_BYTE, recv, rcounts.data(),
                             rdispls.data(), MPI_BYTE, comm));
  return Status::OK();
}

// Step s: send to member me+s, receive from member me-s, in chunks.
Status MpiBackend::PairwiseAlltoallv(MPI_Comm comm, const CollectiveContext& ctx, const char* send,
                                     const std::vector<int64_t>& send_bytes, char* recv,
                                     const std::vector<int64_t>& recv_bytes) {
  const int n = static_cast<int>(ctx.ranks.size());
  std::vector<int64_t> soff(n + 1, 0), roff(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    soff[i + 1] = soff[i] + send_bytes[i];
    roff[i + 1] = roff[i] + recv_bytes[i];
  }
  if (send_bytes[ctx.me] > 0) std::memcpy(recv + roff[ctx.me], send + soff[ctx.me], send_bytes[ctx.me]);
  for (int s = 1; s < n; ++s) {
    const int to = (ctx.me + s) % n, from = (ctx.me - s + n) % n;
    const int64_t total = std::max(send_bytes[to], recv_bytes[from]);
    for (int64_t done = 0; done < total; done += kMaxChunk) {
      int sn = static_cast<int>(std::max<int64_t>(0, std::min(kMaxChunk, send_bytes[to] - done)));
      int rn = static_cast<int>(std::max<int64_t>(0, std::min(kMaxChunk, recv_bytes[from] - done)));
      HVD_MPI_CALL(MPI_Sendrecv(send + soff[to] + (sn ? done : 0), sn, MPI_BYTE, to, 0,
                                recv + roff[from] + (rn ? done : 0), rn, MPI_BYTE, from, 0, comm,
                                MPI_STATUS_IGNORE));
    }
  }
  return Status::OK();
}

Status MpiBackend::ReduceScatter(const CollectiveContext& ctx, const ReduceScatterOptions& o) {
  MPI_Comm comm;
  const void* in = nullptr;
  HVD_RETURN_IF_ERROR(Comm(ctx, &comm));
  HVD_RETURN_IF_ERROR(PrescaledInput(o, &prescaled_, &in));
  HVD_RETURN_IF_ERROR(ReduceScatterUnscaled(comm, ctx, o, in));
  return ScaleBuffer(o.out, o.counts[ctx.me], o.dtype, o.postscale);
}

// Reduce-scatter of `in_buf` (o.in or its prescaled copy), without the scales.
Status MpiBackend::ReduceScatterUnscaled(MPI_Comm comm, const CollectiveContext& ctx,
                                         const ReduceScatterOptions& o, const void* in_buf) {
  const DataType dtype = o.dtype;
  const std::vector<int64_t>& counts = o.counts;
  void* out = o.out;
  MPI_Op mop;
  HVD_RETURN_IF_ERROR(ToMpiOp(dtype, o.op, &mop));
  const MPI_Datatype type = ToMpiType(dtype);
  if (FitsInt(counts)) {
    std::vector<int> c, d;
    IntCountsAndDispls(counts, &c, &d);
    HVD_MPI_CALL(MPI_Reduce_scatter(in_buf, out, c.data(), type, mop, comm));
    return Status::OK();
  }
  // Beyond int counts: one chunked reduction to each member in turn.
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  const char* in = static_cast<const char*>(in_buf);
  int64_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int64_t done = 0; done < counts[i]; done += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, counts[i] - done));
      char* dst = static_cast<int>(i) == ctx.me ? static_cast<char*>(out) + done * esize : nullptr;
      HVD_MPI_CALL(MPI_Reduce(in + (off + done) * esize, dst, n, type, mop, static_cast<int>(i), comm));
    }
    off += counts[i];
  }
  return Status::OK();
}

// Collective over the set's members only (MPI_Comm_create_group, tagged with the set's id so
// that sets created at the same time stay apart): a set registered among its members alone (a
// torch subgroup) and one registered by the whole job are created alike.
Status MpiBackend::AddProcessSet(int32_t id, const std::vector<int>& ranks) {
  int me = 0;
  MPI_Comm_rank(comms_[0], &me);
  if (!std::binary_search(ranks.begin(), ranks.end(), me)) return Status::OK();
  MPI_Group world = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  HVD_MPI_CALL(MPI_Comm_group(comms_[0], &world));
  HVD_MPI_CALL(MPI_Group_incl(world, static_cast<int>(ranks.size()), ranks.data(), &members));
  MPI_Comm comm = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(comms_[0], members, id, &comm);
  MPI_Group_free(&members);
  MPI_Group_free(&world);
  HVD_MPI_CALL(rc);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  comms_[id] = comm;
  return Status::OK();
}

void MpiBackend::RemoveProcessSet(int32_t id) {
  auto it = comms_.find(id);
  if (id == 0 || it == comms_.end()) return;
  MPI_Comm_free(&it->second);
  comms_.erase(it);
}

}  // namespace

// The job must be MPI_COMM_WORLD itself: same size, same rank.
Status CreateMpiBackendImpl(Transport* transport, std::unique_ptr<Backend>* out) {
  HVD_RETURN_IF_ERROR(EnsureMpiInitialized());
  HVD_RETURN_IF_ERROR(InitMpiTypes());
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != transport->size() || rank != transport->rank()) {
    return Status::InvalidArgument(
        "HVDLITE_CPU_OPERATIONS=mpi needs the job to be launched by mpirun (mpirun -n N, or hvdliterun "
        "--mpi): "
        "MPI_COMM_WORLD has " +
        std::to_string(size) + " process(es) but the job has " + std::to_string(transport->size()) +
        "; use HVDLITE_CPU_OPERATIONS=ring with this launcher");
  }
  if (size > 1 && MpiProvidedThreadLevel() < MPI_THREAD_SERIALIZED) {
    return Status::NotSupported(
        "HVDLITE_CPU_OPERATIONS=mpi needs MPI_THREAD_SERIALIZED or better (the "
        "collectives run on hvdlite's background thread); this MPI provides level " +
        std::to_string(MpiProvidedThreadLevel()));
  }
  MPI_Comm world;
  HVD_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  out->reset(new MpiBackend(world));
  return Status::OK();
}

}  // namespace hvdlite
