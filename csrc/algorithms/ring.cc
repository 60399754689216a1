// Ring phases and helpers shared by the collectives (see ring.h).
#include "algorithms/ring.h"

#include <algorithm>
#include <memory>

#include "algorithms/reduce_kernels.h"

namespace hvdlite {
namespace alg {

Range EvenBlock(int64_t count, int parts, int i) {
  const int64_t base = count / parts;
  const int64_t extra = count % parts;
  Range r;
  r.offset = base * i + std::min<int64_t>(i, extra);
  r.count = base + (i < extra ? 1 : 0);
  return r;
}

std::vector<Range> PrefixBlocks(const std::vector<int64_t>& sizes) {
  std::vector<Range> out(sizes.size());
  int64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i].offset = off;
    out[i].count = sizes[i];
    off += sizes[i];
  }
  return out;
}

char* ThreadScratch(size_t bytes) {
  // unique_ptr<double[]> keeps 8-byte alignment for every element type.
  thread_local std::unique_ptr<double[]> buf;
  thread_local size_t cap = 0;
  if (bytes > cap) {
    const size_t want = std::max(bytes, static_cast<size_t>(kPieceBytes));
    buf.reset(new double[(want + sizeof(double) - 1) / sizeof(double)]);
    cap = want;
  }
  return reinterpret_cast<char*>(buf.get());
}

Status CheckGroup(const Group& g, const char* what) {
  if (g.transport == nullptr) return Status::InvalidArgument(std::string(what) + ": group has no transport");
  if (g.size() < 1 || g.me < 0 || g.me >= g.size()) {
    return Status::InvalidArgument(std::string(what) + ": member index " + std::to_string(g.me) +
                                   " outside a group of " + std::to_string(g.size()));
  }
  if (g.ranks[g.me] != g.transport->rank()) {
    return Status::InvalidArgument(std::string(what) + ": group member " + std::to_string(g.me) +
                                   " is rank " + std::to_string(g.ranks[g.me]) +
                                   " but this transport is rank " + std::to_string(g.transport->rank()));
  }
  return Status::OK();
}

ElementReducer::ElementReducer(DataType dtype, ReduceOp op, double postscale)
    : dtype_(dtype), op_(op), postscale_(postscale) {
  reducer_.fn = &ElementReducer::Apply;
  reducer_.ctx = this;
  reducer_.unit = DataTypeSize(dtype);
}

Status ElementReducer::Apply(const void* ctx, void* dst, const void* src, size_t bytes) {
  const ElementReducer* self = static_cast<const ElementReducer*>(ctx);
  const int64_t count = static_cast<int64_t>(bytes / self->reducer_.unit);
  HVD_RETURN_IF_ERROR(ReduceInto(dst, src, count, self->dtype_, self->op_));
  if (self->postscale_ == 1.0) return Status::OK();
  return ScaleBuffer(dst, count, self->dtype_, self->postscale_);
}

Status RingReduceScatter(const Group& g, char* buf, const std::vector<Range>& blocks, DataType dtype,
                         ReduceOp op, int shift, uint32_t tag, double postscale) {
  const int p = g.size();
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  const int next = g.peer(Mod(g.me + 1, p));
  const int prev = g.peer(Mod(g.me - 1, p));
  const ElementReducer partial(dtype, op);
  const ElementReducer last(dtype, op, postscale);
  for (int s = 0; s < p - 1; ++s) {
    const ElementReducer& reduce = s == p - 2 ? last : partial;
    const Range sb = blocks[Mod(g.me - s + shift, p)];
    const Range rb = blocks[Mod(g.me - s - 1 + shift, p)];
    if (sb.count == 0 && rb.count == 0) continue;
    const uint32_t t = tag + static_cast<uint32_t>(s);
    Status st = g.transport->SendRecvReduce(sb.count > 0 ? next : -1, t, buf + sb.offset * es,
                                            static_cast<size_t>(sb.count * es), rb.count > 0 ? prev : -1, t,
                                            buf + rb.offset * es, static_cast<size_t>(rb.count * es),
                                            reduce.reducer());
    if (!st.ok()) return st.WithContext("ring reduce-scatter step " + std::to_string(s));
  }
  return Status::OK();
}

Status RingAllgather(const Group& g, char* buf, const std::vector<Range>& blocks, int shift, uint32_t tag) {
  const int p = g.size();
  const int next = g.peer(Mod(g.me + 1, p));
  const int prev = g.peer(Mod(g.me - 1, p));
  for (int s = 0; s < p - 1; ++s) {
    const Range sb = blocks[Mod(g.me + shift - s, p)];
    const Range rb = blocks[Mod(g.me + shift - s - 1, p)];
    if (sb.count == 0 && rb.count == 0) continue;
    Status st =
        g.transport->SendRecv(sb.count > 0 ? next : -1, tag + static_cast<uint32_t>(s), buf + sb.offset,
                              static_cast<size_t>(sb.count), rb.count > 0 ? prev : -1,
                              tag + static_cast<uint32_t>(s), buf + rb.offset, static_cast<size_t>(rb.count));
    if (!st.ok()) return st.WithContext("ring allgather step " + std::to_string(s));
  }
  return Status::OK();
}

}  // namespace alg
}  // namespace hvdlite
