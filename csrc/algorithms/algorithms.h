// Collective algorithms over a Group (a Transport view). All buffers are raw
// bytes owned by the caller and must stay valid until the call returns. Every
// call blocks until done or failed; it inherits the Transport's timeouts, so
// a dead or hung peer is an error, never a hang. Results are bitwise identical
// on every member.
#pragma once
#include <cstdint>
#include <vector>

#include "algorithms/group.h"
#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

// The algorithms of this folder. Allreduce and Broadcast choose between two
// each by message size; the others have one.
enum class Algorithm : uint8_t {
  kRecursiveDoubling,  // allreduce, small messages
  kRing,               // allreduce: ring reduce-scatter + ring allgather, chunked
  kBinomialTree,       // broadcast, small messages or <= 2 members
  kPipelinedChain,     // broadcast, large messages
  kRingAllgatherv,
  kPairwiseExchange,  // alltoallv
  kRingReduceScatter,
};
// Lower-case name for the timeline and logs, e.g. "recursive_doubling".
const char* AlgorithmName(Algorithm a);

// The algorithm Allreduce / Broadcast pick for a message of `bytes` over
// `members` (the choice they make, exposed for the timeline and logs).
Algorithm AllreduceAlgorithm(int64_t bytes, int members);
Algorithm BroadcastAlgorithm(int64_t bytes, int members);

// In-place allreduce of `count` elements: ring reduce-scatter then ring
// allgather, each step chunked so the next chunk is on the wire while the
// previous one is reduced. `op` is Sum, Min, Max or Product. Works for any
// count, including 0 and counts smaller than the group size. The result is
// multiplied by `postscale` (ScaleBuffer's rules; 1.0 = no pass), each part
// once, by the member that finishes reducing it, while it is still in cache:
// the same bits on every member.
Status Allreduce(const Group& g, void* buf, int64_t count, DataType dtype, ReduceOp op,
                 double postscale = 1.0);

// What Allreduce's recursive doubling leaves on every member (the same
// tree, so the same bits) when member i's buffer holds parts[i], computed
// locally: for a group whose members already sent each other their whole
// buffers (the steady state's ready votes, steady_state.h). `out` receives
// `count` elements and must not overlap a part; parts.size() members >= 1.
// No postscale: the caller scales `out` as Allreduce would.
Status ReduceAsRecursiveDoubling(const std::vector<const char*>& parts, char* out, int64_t count,
                                 DataType dtype, ReduceOp op);

// Gathers member i's `bytes[i]` bytes (from `send`) into `recv`, which holds
// sum(bytes) bytes laid out in member order. `send` may alias recv's own slot.
Status Allgatherv(const Group& g, const void* send, void* recv, const std::vector<int64_t>& bytes);

// Broadcasts `len` bytes in `buf` from member `root` to every member.
Status Broadcast(const Group& g, void* buf, int64_t len, int root);

// Member i sends send_bytes[j] bytes (consecutive in `send`, in member order) to
// member j and receives recv_bytes[j] bytes from member j into `recv` (in
// member order).
Status Alltoallv(const Group& g, const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                 const std::vector<int64_t>& recv_bytes);

// Reduces `in` (sum(counts) elements, member-ordered blocks of counts[i]
// elements) across members; member i ends with the reduced block i in `out`
// (counts[me] elements, not overlapping `in`). `in` is only read.
Status ReduceScatter(const Group& g, const void* in, const std::vector<int64_t>& counts, void* out,
                     DataType dtype, ReduceOp op);

}  // namespace hvdlite
