// Alltoallv: pairwise exchange.
//
// Member m copies its own block locally, then for k = 1 .. size-1 sends its
// block for member m+k to m+k while receiving the block from m-k, in one
// SendRecv tagged tag + k. Each step pairs every member with one sender and
// one receiver, so no member is overloaded and no step can deadlock. Empty
// blocks still exchange an empty message so that the two sides' sizes are
// checked by the transport. No scratch memory.
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/ring.h"

namespace hvdlite {

Status Alltoallv(const Group& g, const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                 const std::vector<int64_t>& recv_bytes) {
  HVD_RETURN_IF_ERROR(alg::CheckGroup(g, "Alltoallv"));
  const int p = g.size();
  if (static_cast<int>(send_bytes.size()) != p || static_cast<int>(recv_bytes.size()) != p) {
    return Status::InvalidArgument("Alltoallv: split sizes do not match a group of " + std::to_string(p));
  }
  for (int i = 0; i < p; ++i) {
    if (send_bytes[i] < 0 || recv_bytes[i] < 0) return Status::InvalidArgument("Alltoallv: negative split");
  }
  if (send_bytes[g.me] != recv_bytes[g.me]) {
    return Status::InvalidArgument("Alltoallv: sends " + std::to_string(send_bytes[g.me]) +
                                   " bytes to itself but expects " + std::to_string(recv_bytes[g.me]));
  }
  const std::vector<alg::Range> sblocks = alg::PrefixBlocks(send_bytes);
  const std::vector<alg::Range> rblocks = alg::PrefixBlocks(recv_bytes);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  if (recv_bytes[g.me] > 0) {
    std::memmove(out + rblocks[g.me].offset, in + sblocks[g.me].offset,
                 static_cast<size_t>(recv_bytes[g.me]));
  }
  for (int k = 1; k < p; ++k) {
    const int to = alg::Mod(g.me + k, p);
    const int from = alg::Mod(g.me - k, p);
    const uint32_t tag = g.tag + static_cast<uint32_t>(k);
    Status st = g.transport->SendRecv(g.peer(to), tag, in + sblocks[to].offset,
                                      static_cast<size_t>(send_bytes[to]), g.peer(from), tag,
                                      out + rblocks[from].offset, static_cast<size_t>(recv_bytes[from]));
    if (!st.ok()) return st.WithContext("Alltoallv step " + std::to_string(k));
  }
  return Status::OK();
}

}  // namespace hvdlite
