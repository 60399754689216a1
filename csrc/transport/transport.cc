// Default implementations of the optional Transport primitives, and the
// factory that puts the shared-memory transport over the TCP one (the only
// place that knows both: shm_* sees the TCP transport as a SteppedTransport).
#include "transport/transport.h"

#include <algorithm>
#include <vector>

#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"

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

namespace {
Status RunSpec(Transport* t, const ExchangeSpec& e) {
  if (e.reducer != nullptr) {
    return t->SendRecvReduce(e.send_peer, e.send_tag, e.send_data, e.send_len, e.recv_peer, e.recv_tag,
                             e.recv_data, e.recv_len, *e.reducer);
  }
  return t->SendRecv(e.send_peer, e.send_tag, e.send_data, e.send_len, e.recv_peer, e.recv_tag, e.recv_data,
                     e.recv_len);
}
}  // namespace

// Generic fallback: one exchange after the other (see the contract in transport.h).
Status Transport::SendRecvPair(const ExchangeSpec& a, const ExchangeSpec& b) {
  if (a.send_peer != -1 || a.recv_peer != -1) HVD_RETURN_IF_ERROR(RunSpec(this, a));
  if (b.send_peer != -1 || b.recv_peer != -1) HVD_RETURN_IF_ERROR(RunSpec(this, b));
  return Status::OK();
}

Status CreateShmTransport(Store* store, const std::string& prefix, int rank, int size,
                          const std::string& advertise_host, const std::string& secret,
                          double connect_timeout_s, double io_timeout_s,
                          const std::vector<std::string>& hosts, const ShmOptions& opts,
                          std::unique_ptr<Transport>* out, int liveness_s) {
  if (static_cast<int>(hosts.size()) != size) {
    return Status::InvalidArgument("CreateShmTransport: " + std::to_string(hosts.size()) +
                                   " host names for " + std::to_string(size) + " ranks");
  }
  // Connected before the segment exchange: the ring (failures reach every
  // rank) and the shared-memory partners (their doorbell and liveness are TCP).
  std::vector<int> eager = RingNeighbours(rank, size);
  if (!opts.disable) {
    for (int q : ShmPartnerRanks(hosts, rank)) eager.push_back(q);
  }
  std::sort(eager.begin(), eager.end());
  eager.erase(std::unique(eager.begin(), eager.end()), eager.end());
  std::unique_ptr<TcpTransport> tcp;
  HVD_RETURN_IF_ERROR(NewTcpTransport(store, prefix, rank, size, advertise_host, secret, connect_timeout_s,
                                      io_timeout_s, liveness_s, eager, hosts, &tcp));
  return AddSharedMemory(std::move(tcp), store, prefix, secret, connect_timeout_s, io_timeout_s, hosts, opts,
                         out);
}

}  // namespace hvdlite
