// Allreduce: ring reduce-scatter + ring allgather for large messages,
// recursive doubling for small ones.
//
// Ring (bytes >= kSmallAllreduceBytes): the buffer is processed in chunks of
// size * kRingBlockBytes (the last one shorter); each chunk is cut into
// `size` segments (alg::EvenBlock: the first count % size get one extra
// element). Reduce-scatter (size-1 steps) leaves member m with segment m+1
// fully reduced along one fixed chain of members, and multiplied by the
// postscale as that last step reduces it (while each slot is in cache; only
// the owner scales a segment); allgather (size-1 steps) copies each reduced
// segment to everyone. Every member therefore ends with the same bits.
// Chunking keeps a chunk in cache from its reduce-scatter to its allgather
// (see ChunkedRing). Chunk c uses tags tag + base(c) + step,
// base(c) = c * 2(size-1) modulo (65536 - 2(size-1)).
//
// Recursive doubling (bytes < kSmallAllreduceBytes), log2 rounds instead of
// 2(size-1) steps. With p2 the largest power of two <= size:
//  1. fold (tag + 0): member r >= p2 sends its buffer to member r - p2, which
//     reduces it as op(own, extra);
//  2. round k (tag + 1 + k), distance d = 2^k, over members < p2: a and a^d
//     swap partial results and both compute op(lower member's, upper member's),
//     so the pair holds identical bits (operand order fixed by member index);
//  3. unfold (tag + 1 + log2(p2)): member r < size - p2 sends the result to r + p2.
// Scratch: the message size (< 64 KiB) of thread-local memory.
// Tags used: tag + [0, 65536) for the ring, tag + [0, 2 + log2(size)] for
// recursive doubling.
#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/reduce_kernels.h"
#include "algorithms/ring.h"

namespace hvdlite {
namespace {

Status CheckReducible(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool || DataTypeSize(dtype) == 0) {
    return Status::NotSupported(std::string("allreduce of dtype ") + DataTypeName(dtype));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax && op != ReduceOp::kProduct) {
    return Status::NotSupported(std::string("allreduce with op ") + ReduceOpName(op) +
                                " (Average is Sum plus a postscale)");
  }
  return Status::OK();
}

// Exchanges the whole buffer with member `partner` and leaves
// op(lower member's value, upper member's value) in buf on both sides.
Status ExchangeReduce(const Group& g, char* buf, int64_t count, DataType dtype, ReduceOp op, int partner,
                      uint32_t tag) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  char* other = alg::ThreadScratch(bytes);
  const int peer = g.peer(partner);
  HVD_RETURN_IF_ERROR(g.transport->SendRecv(peer, tag, buf, bytes, peer, tag, other, bytes));
  if (g.me < partner) return ReduceInto(buf, other, count, dtype, op);
  HVD_RETURN_IF_ERROR(ReduceInto(other, buf, count, dtype, op));
  std::memcpy(buf, other, bytes);
  return Status::OK();
}

Status RecursiveDoubling(const Group& g, char* buf, int64_t count, DataType dtype, ReduceOp op) {
  const int p = g.size();
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  int p2 = 1;
  int rounds = 0;
  while (p2 * 2 <= p) {
    p2 *= 2;
    ++rounds;
  }
  const int extras = p - p2;
  const uint32_t unfold_tag = g.tag + 1 + static_cast<uint32_t>(rounds);
  if (g.me >= p2) {  // extra member: contribute, then wait for the result
    HVD_RETURN_IF_ERROR(g.transport->Send(g.peer(g.me - p2), g.tag, buf, bytes));
    return g.transport->Recv(g.peer(g.me - p2), unfold_tag, buf, bytes);
  }
  if (g.me < extras) {
    char* other = alg::ThreadScratch(bytes);
    HVD_RETURN_IF_ERROR(g.transport->Recv(g.peer(g.me + p2), g.tag, other, bytes));
    HVD_RETURN_IF_ERROR(ReduceInto(buf, other, count, dtype, op));
  }
  for (int k = 0; k < rounds; ++k) {
    HVD_RETURN_IF_ERROR(
        ExchangeReduce(g, buf, count, dtype, op, g.me ^ (1 << k), g.tag + 1 + static_cast<uint32_t>(k)));
  }
  if (g.me < extras) {
    HVD_RETURN_IF_ERROR(g.transport->Send(g.peer(g.me + p2), unfold_tag, buf, bytes));
  }
  return Status::OK();
}

Status Ring(const Group& g, char* buf, int64_t count, DataType dtype, ReduceOp op, double postscale,
            uint32_t tag) {
  const int p = g.size();
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<alg::Range> segs(p);
  for (int i = 0; i < p; ++i) segs[i] = alg::EvenBlock(count, p, i);
  HVD_RETURN_IF_ERROR(alg::RingReduceScatter(g, buf, segs, dtype, op, /*shift=*/0, tag, postscale));
  for (auto& r : segs) {  // allgather works on byte ranges
    r.offset *= es;
    r.count *= es;
  }
  // Member m now holds segment m + 1.
  return alg::RingAllgather(g, buf, segs, /*shift=*/1, tag + static_cast<uint32_t>(p - 1));
}

// Large buffers: one ring allreduce per chunk of size * kRingBlockBytes, so
// that a chunk is still in this core's cache when its reduced segment is sent
// on in the allgather phase and when the gathered segments land: each byte of
// the buffer then crosses the memory bus about twice (read, write back)
// instead of about three times.
Status ChunkedRing(const Group& g, char* buf, int64_t count, DataType dtype, ReduceOp op, double postscale) {
  const int p = g.size();
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t chunk = std::max<int64_t>(1, alg::kRingBlockBytes / es) * p;
  const uint32_t tags_per_chunk = static_cast<uint32_t>(2 * (p - 1));
  uint32_t c = 0;
  for (int64_t off = 0; off < count; off += chunk, ++c) {
    const int64_t n = std::min(chunk, count - off);
    const uint32_t base = (c * tags_per_chunk) % (0x10000u - tags_per_chunk);
    Status st = Ring(g, buf + off * es, n, dtype, op, postscale, g.tag + base);
    if (!st.ok()) return st.WithContext("chunk " + std::to_string(c));
  }
  return Status::OK();
}

}  // namespace

// RecursiveDoubling's arithmetic without the messages: value[r] is member r's
// partial result after each phase (fold, then round k pairing r and r ^ 2^k,
// both ending with op(lower's, upper's)). After round k the members of each
// block of 2^(k+1) hold the same value, so only the block's first member's is
// computed. A value lives in a part until it is first reduced into, then in
// `out` (member 0) or in a work buffer.
Status ReduceAsRecursiveDoubling(const std::vector<const char*>& parts, char* out, int64_t count,
                                 DataType dtype, ReduceOp op) {
  HVD_RETURN_IF_ERROR(CheckReducible(dtype, op));
  const int p = static_cast<int>(parts.size());
  if (p < 1 || count < 0) return Status::InvalidArgument("ReduceAsRecursiveDoubling: no parts");
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  thread_local std::vector<const char*> value;  // reused: no allocation per call
  value.assign(parts.begin(), parts.begin() + p2);
  std::vector<char> work;
  auto writable = [&](int r) {
    if (r > 0 && work.empty()) work.resize(bytes * static_cast<size_t>(p2 - 1));
    char* own = r == 0 ? out : work.data() + static_cast<size_t>(r - 1) * bytes;
    if (value[r] != own) std::memcpy(own, value[r], bytes);
    value[r] = own;
    return own;
  };
  for (int r = 0; r < p - p2; ++r)
    HVD_RETURN_IF_ERROR(ReduceInto(writable(r), parts[r + p2], count, dtype, op));
  for (int d = 1; d < p2; d *= 2) {
    for (int a = 0; a < p2; a += 2 * d)
      HVD_RETURN_IF_ERROR(ReduceInto(writable(a), value[a + d], count, dtype, op));
  }
  writable(0);
  return Status::OK();
}

const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kBinomialTree:
      return "binomial_tree";
    case Algorithm::kPipelinedChain:
      return "pipelined_chain";
    case Algorithm::kRingAllgatherv:
      return "ring_allgatherv";
    case Algorithm::kPairwiseExchange:
      return "pairwise_exchange";
    case Algorithm::kRingReduceScatter:
      return "ring_reduce_scatter";
  }
  return "unknown";
}

Algorithm AllreduceAlgorithm(int64_t bytes, int members) {
  return bytes < alg::kSmallAllreduceBytes ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
}

Status Allreduce(const Group& g, void* buf, int64_t count, DataType dtype, ReduceOp op, double postscale) {
  HVD_RETURN_IF_ERROR(alg::CheckGroup(g, "Allreduce"));
  HVD_RETURN_IF_ERROR(CheckReducible(dtype, op));
  if (count < 0) return Status::InvalidArgument("Allreduce: negative count");
  if (g.size() == 1 || count == 0) return ScaleBuffer(buf, count, dtype, postscale);
  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(dtype));
  char* data = static_cast<char*>(buf);
  Status st;
  if (AllreduceAlgorithm(bytes, g.size()) == Algorithm::kRecursiveDoubling) {
    st = RecursiveDoubling(g, data, count, dtype, op);
    if (st.ok()) st = ScaleBuffer(data, count, dtype, postscale);
  } else {
    st = ChunkedRing(g, data, count, dtype, op, postscale);
  }
  return st.WithContext(std::string("Allreduce of ") + std::to_string(count) + " " + DataTypeName(dtype) +
                        " (" + ReduceOpName(op) + ")");
}

}  // namespace hvdlite
