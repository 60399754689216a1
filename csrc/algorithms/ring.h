// Internal building blocks shared by the collective algorithms (not part of
// the public algorithms.h contract).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/group.h"
#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {
namespace alg {

// A contiguous range of a buffer, in elements or bytes depending on the user.
struct Range {
  int64_t offset = 0;
  int64_t count = 0;
};

// Block i of `count` items split into `parts` near-equal blocks: the first
// count % parts blocks get one extra item.
Range EvenBlock(int64_t count, int parts, int i);

// Consecutive blocks of the given sizes (prefix sums).
std::vector<Range> PrefixBlocks(const std::vector<int64_t>& sizes);

// A scratch buffer of at least `bytes` bytes owned by the calling thread and
// reused by every later call on that thread (16-byte aligned). It only grows;
// the algorithms ask for at most max(kPieceBytes, kSmallAllreduceBytes).
char* ThreadScratch(size_t bytes);

// Pipelining granularity of the ring reduce-scatter and the broadcast chain.
constexpr int64_t kPieceBytes = 256 << 10;
// Large allreduces run the ring on chunks of (size * this) bytes: a chunk
// stays in cache between its reduce-scatter and its allgather.
constexpr int64_t kRingBlockBytes = 256 << 10;
// Allreduce messages below this many bytes use recursive doubling.
constexpr int64_t kSmallAllreduceBytes = 64 << 10;
// Broadcasts below this many bytes (or over <= 2 members) use a binomial tree.
constexpr int64_t kSmallBroadcastBytes = 256 << 10;

// A Transport::Reducer applying `op` to elements of `dtype`
// (dst = op(dst, src), reduce_kernels.h), then, when `postscale` != 1,
// multiplying those elements by it (ScaleBuffer's rules) while they are still
// in cache. Keep it alive while the transport call that uses reducer() runs.
class ElementReducer {
 public:
  ElementReducer(DataType dtype, ReduceOp op, double postscale = 1.0);
  const Reducer& reducer() const { return reducer_; }

 private:
  static Status Apply(const void* ctx, void* dst, const void* src, size_t bytes);
  DataType dtype_;
  ReduceOp op_;
  double postscale_;
  Reducer reducer_;
};

// Validates the group (transport set, me in range, ranks[me] == transport rank).
Status CheckGroup(const Group& g, const char* what);

// True when p is a power of two (p >= 1).
inline bool IsPow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

inline int Mod(int a, int p) { return ((a % p) + p) % p; }

// Ring reduce-scatter over `blocks` (element ranges of `buf`, one per member).
// Step s (0 <= s < size-1): member m sends block (m - s + shift) to m+1 and
// receives block (m - s - 1 + shift) from m-1, which it reduces into its own
// copy as dst = op(own, received): one Transport::SendRecvReduce per step, so
// the transport pipelines the block (TCP reduces each 256 KiB piece out of a
// scratch buffer while the next one arrives; shared memory reduces each slot
// straight out of the sender's ring). Afterwards member m holds the fully
// reduced block (m + 1 + shift).
// Block b is reduced along one fixed chain, so the result is deterministic.
// The last step also multiplies what it reduces by `postscale` (1.0 = no
// pass): the fully reduced block leaves scaled, by its one owner.
// Message tags: tag + s.
Status RingReduceScatter(const Group& g, char* buf, const std::vector<Range>& blocks, DataType dtype,
                         ReduceOp op, int shift, uint32_t tag, double postscale = 1.0);

// Ring allgather over `blocks` (byte ranges of `buf`, one per member) where
// member m starts with block (m + shift) complete. Step s: member m sends block
// (m + shift - s) to m+1 and receives block (m + shift - s - 1) from m-1 in
// place. A step whose blocks are both empty sends nothing (every member knows
// every block size). Message tags: tag + s.
Status RingAllgather(const Group& g, char* buf, const std::vector<Range>& blocks, int shift, uint32_t tag);

}  // namespace alg
}  // namespace hvdlite
