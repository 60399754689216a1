// TcpTransport: the Transport over one TCP connection per pair of ranks.
//
// Private to csrc/transport (others use CreateTcpTransport in transport.h).
// Frames are described in tcp_wire.h. Each peer keeps a small receive state
// that survives between calls: a partially read frame header, a DATA header
// already parsed (left for the Recv that names its tag), a CONTROL payload
// being read, and the queue of complete control messages. The data path
// allocates nothing and waits only in poll().
#pragma once
#include <poll.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/stepped.h"
#include "transport/tcp_wire.h"
#include "transport/transport.h"

namespace hvdlite {

class TcpTransport : public SteppedTransport {
 public:
  // Takes ownership of the connected sockets (fds[rank] == -1).
  TcpTransport(int rank, int size, std::vector<int> fds, double io_timeout_s);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Send(int peer, uint32_t tag, const void* data, size_t len) override;
  Status Recv(int peer, uint32_t tag, void* data, size_t len) override;
  Status SendRecv(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len, int recv_peer,
                  uint32_t recv_tag, void* recv_data, size_t recv_len) override;

  Status SendRecvReduce(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                        int recv_peer, uint32_t recv_tag, void* recv_dst, size_t recv_len,
                        const Reducer& reducer) override;

  Status SendControl(int peer, const std::string& payload) override;
  Status WaitControl(int wake_fd, int timeout_ms, std::vector<ControlMessage>* out) override;

  void Depart() override;
  bool PeerDeparted(int peer) const override;
  void Close() override;

  // ---- SteppedTransport (stepped.h): used by the shared-memory transport,
  // which keeps this transport as its liveness channel and for peers on other
  // hosts. Same thread as every other call.
  Status StepOps(SendOp* s, RecvOp* r, bool* progressed) override;
  Status TimeoutError(const SendOp& s, const RecvOp& r) const override;
  // The NUDGE frame is tcp_wire's doorbell; a sleeping peer's WaitEvents returns on it.
  Status WaitEvents(int wake_fd, int timeout_ms, int writable_peer, int readable_peer,
                    std::vector<ControlMessage>* out, bool* woken) override;
  void Nudge(int peer) override;
  bool PeerClosed(int peer) const override { return peers_[peer].closed; }
  Status Abort(const Status& st) override { return Fail(st); }
  const Status& broken() const override { return broken_; }

 private:
  struct Peer {
    int fd = -1;
    tcp_wire::FrameHeader hdr{};  // the frame being received
    size_t hdr_got = 0;           // bytes of hdr read so far
    bool data_pending = false;    // hdr is a complete DATA header awaiting its Recv
    bool in_payload = false;      // reading a CONTROL/ABORT payload into `payload`
    std::string payload;
    size_t payload_got = 0;
    std::deque<std::string> control;  // complete control messages, oldest first
    bool departed = false;            // the peer sent DEPART
    bool closed = false;              // a departed peer's connection reached EOF
    bool send_mid_frame = false;      // a frame to this peer is partially written
  };

  Status CheckPeer(int peer, const char* what) const;
  Status SelfCopy(uint32_t send_tag, const void* send_data, size_t send_len, uint32_t recv_tag,
                  void* recv_data, size_t recv_len);
  Status WriteFrame(int peer, uint32_t kind, uint32_t tag, const void* data, size_t len);
  Status PrepareOps(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len, int recv_peer,
                    uint32_t recv_tag, void* recv_data, size_t recv_len, const Reducer* reducer, SendOp* s,
                    RecvOp* r) const;
  Status RunOps(SendOp* s, RecvOp* r);
  Status ProgressSend(SendOp* s, bool* progressed);
  Status ProgressRecv(RecvOp* r, bool* progressed);
  Status ReceiveReducing(RecvOp* r, bool* progressed);
  Status RecvStalled(int peer, ssize_t n) const;
  Status FinishReceive(RecvOp* r);
  Status WaitImpl(int wake_fd, int timeout_ms, int writable_peer, int readable_peer, bool any_progress,
                  std::vector<ControlMessage>* out, bool* woken);

  // Reads frames from `peer` without blocking until EAGAIN, until a DATA
  // header is parsed, or until EOF of a departed peer. Control messages go to
  // the peer's queue. *progressed is set when a byte was read.
  Status Pump(int peer, bool* progressed);
  Status OnHeader(int peer);
  Status OnPayload(int peer);
  Status PeerLost(int peer, int err) const;

  // Records the first error, tells the peers (ABORT) and returns it.
  Status Fail(const Status& st);
  void BroadcastAbort(const std::string& reason);

  int rank_, size_;
  double io_timeout_s_;
  std::vector<Peer> peers_;
  Status broken_;
  bool closed_ = false;
  bool departed_ = false;
  std::vector<pollfd> poll_fds_;  // WaitControl scratch, reused to avoid allocating
  std::vector<int> poll_owners_;
  std::vector<char> reduce_scratch_;  // ReceiveReducing: one piece of an incoming message
  bool nudged_ = false;               // a NUDGE arrived since the last WaitEvents
};

// CreateTcpTransport's work, returning the concrete type (for the factory of
// the shared-memory transport, which keeps it as a SteppedTransport).
Status NewTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                       const std::string& advertise_host, const std::string& secret, double connect_timeout_s,
                       double io_timeout_s, std::unique_ptr<TcpTransport>* out);

}  // namespace hvdlite
