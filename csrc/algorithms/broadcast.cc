// Broadcast from member `root`, in member indices relative to the root
// (v = (m - root) mod size).
//
// Binomial tree (len < kSmallBroadcastBytes, or size <= 2): member v > 0
// receives from v - lowbit(v) with tag tag + log2(lowbit(v)), then sends to
// v + 2^k for every 2^k < lowbit(v) (all 2^k < size for the root), farthest
// first, tag tag + k. log2(size) rounds; the root sends the whole message
// log2(size) times.
//
// Pipelined chain (large messages): v receives kPieceBytes pieces from v - 1
// and forwards each to v + 1 while receiving the next one (SendRecv), so the
// time is about len / bandwidth + (size - 2) pieces. Tags: tag + 0. No scratch
// memory: pieces go straight into `buf`.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/ring.h"

namespace hvdlite {
namespace {

Status Binomial(const Group& g, char* buf, size_t len, int root) {
  const int p = g.size();
  const int v = alg::Mod(g.me - root, p);
  int mask = 1;
  int bit = 0;
  while (mask < p) {
    if (v & mask) {
      HVD_RETURN_IF_ERROR(g.transport->Recv(g.peer(alg::Mod(v - mask + root, p)), g.tag + bit, buf, len));
      break;
    }
    mask <<= 1;
    ++bit;
  }
  for (mask >>= 1, --bit; mask > 0; mask >>= 1, --bit) {
    if (v + mask < p) {
      HVD_RETURN_IF_ERROR(g.transport->Send(g.peer(alg::Mod(v + mask + root, p)), g.tag + bit, buf, len));
    }
  }
  return Status::OK();
}

Status Chain(const Group& g, char* buf, int64_t len, int root) {
  const int p = g.size();
  const int v = alg::Mod(g.me - root, p);
  const int prev = v > 0 ? g.peer(alg::Mod(g.me - 1, p)) : -1;
  const int next = v + 1 < p ? g.peer(alg::Mod(g.me + 1, p)) : -1;
  const int64_t n = (len + alg::kPieceBytes - 1) / alg::kPieceBytes;
  auto piece_len = [&](int64_t j) {
    return static_cast<size_t>(std::min(alg::kPieceBytes, len - j * alg::kPieceBytes));
  };
  auto piece = [&](int64_t j) { return buf + j * alg::kPieceBytes; };
  // Iteration j forwards piece j - 1 and receives piece j (either may not exist).
  for (int64_t j = 0; j <= n; ++j) {
    const bool fwd = prev >= 0 && next >= 0 && j >= 1;
    const bool rcv = prev >= 0 && j < n;
    const bool own = prev < 0 && j < n;  // the root sends piece j right away
    if (own) {
      HVD_RETURN_IF_ERROR(g.transport->Send(next, g.tag, piece(j), piece_len(j)));
    } else if (fwd || rcv) {
      HVD_RETURN_IF_ERROR(g.transport->SendRecv(fwd ? next : -1, g.tag, fwd ? piece(j - 1) : nullptr,
                                                fwd ? piece_len(j - 1) : 0, rcv ? prev : -1, g.tag,
                                                rcv ? piece(j) : nullptr, rcv ? piece_len(j) : 0));
    }
  }
  return Status::OK();
}

}  // namespace

Algorithm BroadcastAlgorithm(int64_t bytes, int members) {
  return (bytes < alg::kSmallBroadcastBytes || members <= 2) ? Algorithm::kBinomialTree
                                                             : Algorithm::kPipelinedChain;
}

Status Broadcast(const Group& g, void* buf, int64_t len, int root) {
  HVD_RETURN_IF_ERROR(alg::CheckGroup(g, "Broadcast"));
  if (root < 0 || root >= g.size()) {
    return Status::InvalidArgument("Broadcast: root " + std::to_string(root) + " outside a group of " +
                                   std::to_string(g.size()));
  }
  if (len < 0) return Status::InvalidArgument("Broadcast: negative length");
  if (g.size() == 1 || len == 0) return Status::OK();
  char* data = static_cast<char*>(buf);
  const bool tree = BroadcastAlgorithm(len, g.size()) == Algorithm::kBinomialTree;
  Status st = tree ? Binomial(g, data, static_cast<size_t>(len), root) : Chain(g, data, len, root);
  return st.WithContext("Broadcast of " + std::to_string(len) + " bytes from member " + std::to_string(root));
}

}  // namespace hvdlite
