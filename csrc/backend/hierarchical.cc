// Pipelined two-level allreduce (hierarchical.h).
#include "backend/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/reduce_kernels.h"
#include "algorithms/ring.h"

namespace hvdlite {
namespace {

using alg::EvenBlock;
using alg::Mod;
using alg::Range;

// Chunks are about this big (at most kMaxChunks of them), so the pipeline's
// fill and drain (one local phase each) stay short next to the cross phase.
constexpr int64_t kChunkBytes = 2 << 20;
constexpr int64_t kMaxChunks = 16;

// Element ranges of the chunk's L local blocks (absolute in the buffer).
std::vector<Range> LocalBlocks(const Range& chunk, int parts) {
  std::vector<Range> out(parts);
  for (int i = 0; i < parts; ++i) {
    out[i] = EvenBlock(chunk.count, parts, i);
    out[i].offset += chunk.offset;
  }
  return out;
}

// One ring step over `blocks` (element ranges): send block sb to next,
// receive block rb from prev (reduced when `reducer` is set). An empty block
// skips its direction; a step with both empty stays in the list, doing nothing,
// so every rank's step lists line up.
ExchangeSpec RingStep(const Group& g, char* buf, int64_t es, const Range& sb, const Range& rb, uint32_t tag,
                      const Reducer* reducer) {
  const int p = g.size();
  ExchangeSpec e;
  if (sb.count > 0) {
    e.send_peer = g.peer(Mod(g.me + 1, p));
    e.send_tag = tag;
    e.send_data = buf + sb.offset * es;
    e.send_len = static_cast<size_t>(sb.count * es);
  }
  if (rb.count > 0) {
    e.recv_peer = g.peer(Mod(g.me - 1, p));
    e.recv_tag = tag;
    e.recv_data = buf + rb.offset * es;
    e.recv_len = static_cast<size_t>(rb.count * es);
    e.reducer = reducer;
  }
  return e;
}

// Reduce-scatter (member m ends with block m fully reduced) then, when
// `with_allgather`, the allgather of those blocks; appended as ring steps.
void AppendReduceScatter(const Group& g, char* buf, int64_t es, const std::vector<Range>& b, uint32_t tag,
                         const Reducer* reducer, std::vector<ExchangeSpec>* out) {
  const int p = g.size();
  for (int s = 0; s < p - 1; ++s) {
    out->push_back(RingStep(g, buf, es, b[Mod(g.me - s - 1, p)], b[Mod(g.me - s - 2, p)],
                            tag + static_cast<uint32_t>(s), reducer));
  }
}
void AppendAllgather(const Group& g, char* buf, int64_t es, const std::vector<Range>& b, uint32_t tag,
                     std::vector<ExchangeSpec>* out) {
  const int p = g.size();
  for (int s = 0; s < p - 1; ++s) {
    out->push_back(RingStep(g, buf, es, b[Mod(g.me - s, p)], b[Mod(g.me - s - 1, p)],
                            tag + static_cast<uint32_t>(s), nullptr));
  }
}

}  // namespace

Status PipelinedHierarchicalAllreduce(const Group& local, const Group& cross, void* buf, int64_t count,
                                      DataType dtype, ReduceOp op, double postscale) {
  if (count <= 0) return Status::OK();
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  char* data = static_cast<char*>(buf);
  const int L = local.size(), H = cross.size();
  const int chunks =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kMaxChunks, count * es / kChunkBytes)));
  const alg::ElementReducer reduce(dtype, op);
  const uint32_t rs_tag = local.tag, ag_tag = local.tag + static_cast<uint32_t>(L);
  const uint32_t xrs_tag = cross.tag + static_cast<uint32_t>(2 * L),
                 xag_tag = xrs_tag + static_cast<uint32_t>(H);
  std::vector<ExchangeSpec> local_steps, cross_steps;
  for (int t = 0; t < chunks + 2; ++t) {
    local_steps.clear();
    cross_steps.clear();
    if (t < chunks) {
      AppendReduceScatter(local, data, es, LocalBlocks(EvenBlock(count, chunks, t), L), rs_tag,
                          &reduce.reducer(), &local_steps);
    }
    if (t >= 2) {
      AppendAllgather(local, data, es, LocalBlocks(EvenBlock(count, chunks, t - 2), L), ag_tag, &local_steps);
    }
    Range own;  // this member's block of chunk t-1, allreduced across hosts in this tick
    if (t >= 1 && t <= chunks) {
      own = LocalBlocks(EvenBlock(count, chunks, t - 1), L)[local.me];
      const std::vector<Range> sub = LocalBlocks(own, H);
      AppendReduceScatter(cross, data, es, sub, xrs_tag, &reduce.reducer(), &cross_steps);
      AppendAllgather(cross, data, es, sub, xag_tag, &cross_steps);
    }
    const size_t n = std::max(local_steps.size(), cross_steps.size());
    for (size_t i = 0; i < n; ++i) {
      const ExchangeSpec a = i < local_steps.size() ? local_steps[i] : ExchangeSpec();
      const ExchangeSpec b = i < cross_steps.size() ? cross_steps[i] : ExchangeSpec();
      Status st = local.transport->SendRecvPair(a, b);
      if (!st.ok()) return st.WithContext("two-level allreduce, tick " + std::to_string(t));
    }
    if (own.count > 0) HVD_RETURN_IF_ERROR(ScaleBuffer(data + own.offset * es, own.count, dtype, postscale));
  }
  return Status::OK();
}

Status HierarchicalAllgatherv(const Group& local, const Group& cross, const void* send, void* recv,
                              const std::vector<int64_t>& bytes) {
  const int L = local.size(), H = cross.size();
  if (static_cast<int>(bytes.size()) != L * H) {
    return Status::InvalidArgument("two-level allgatherv: " + std::to_string(bytes.size()) +
                                   " block sizes for " + std::to_string(H) + " hosts x " + std::to_string(L));
  }
  for (int64_t b : bytes) {
    if (b < 0) return Status::InvalidArgument("two-level allgatherv: negative block size");
  }
  const std::vector<Range> blocks = alg::PrefixBlocks(bytes);
  char* out = static_cast<char*>(recv);
  const Range mine = blocks[cross.me * L + local.me];
  if (mine.count > 0 && send != out + mine.offset) {
    std::memmove(out + mine.offset, send, static_cast<size_t>(mine.count));
  }
  std::vector<Range> host(H);  // every host's bytes, contiguous in `out`
  for (int k = 0; k < H; ++k) {
    host[k].offset = blocks[k * L].offset;
    for (int j = 0; j < L; ++j) host[k].count += blocks[k * L + j].count;
  }
  std::vector<Range> lb(L), xb(H);
  for (int j = 0; j < L; ++j) lb[j] = blocks[cross.me * L + j];
  HVD_RETURN_IF_ERROR(
      alg::RingAllgather(local, out, lb, 0, local.tag).WithContext("two-level allgatherv, host"));
  for (int k = 0; k < H; ++k) xb[k] = LocalBlocks(host[k], L)[local.me];
  const uint32_t xtag = local.tag + static_cast<uint32_t>(L);
  HVD_RETURN_IF_ERROR(alg::RingAllgather(cross, out, xb, 0, xtag).WithContext("two-level allgatherv, cross"));
  for (int k = 0; k < H; ++k) {
    if (k == cross.me) continue;
    const uint32_t tag = xtag + static_cast<uint32_t>(H + k * L);
    HVD_RETURN_IF_ERROR(alg::RingAllgather(local, out, LocalBlocks(host[k], L), 0, tag)
                            .WithContext("two-level allgatherv, pieces of host " + std::to_string(k)));
  }
  return Status::OK();
}

}  // namespace hvdlite
