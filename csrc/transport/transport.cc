// Default implementations of the optional Transport primitives.
#include "transport/transport.h"

#include <vector>

namespace hvdlite {

// Generic fallback: receive the whole message into a temporary buffer, then
// reduce it. Transports override this to avoid the extra copy.
Status Transport::SendRecvReduce(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                                 int recv_peer, uint32_t recv_tag, void* recv_dst, size_t recv_len,
                                 const Reducer& reducer) {
  std::vector<char> tmp(recv_peer >= 0 ? recv_len : 0);
  HVD_RETURN_IF_ERROR(
      SendRecv(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, tmp.data(), tmp.size()));
  if (recv_peer < 0 || recv_len == 0) return Status::OK();
  return reducer.fn(reducer.ctx, recv_dst, tmp.data(), recv_len);
}

}  // namespace hvdlite
