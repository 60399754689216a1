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
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/tcp_wire.h"
#include "transport/transport.h"

namespace hvdlite {

class TcpTransport : public Transport {
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

  Status SendControl(int peer, const std::string& payload) override;
  Status WaitControl(int wake_fd, int timeout_ms, std::vector<ControlMessage>* out) override;

  void Depart() override;
  bool PeerDeparted(int peer) const override;
  void Close() override;

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

  // One direction of a SendRecv.
  struct SendOp {
    int peer = -1;
    tcp_wire::FrameHeader hdr{};
    const char* data = nullptr;
    size_t len = 0;
    size_t sent = 0;  // over header + payload
    bool done = true;
  };
  struct RecvOp {
    int peer = -1;
    uint32_t tag = 0;
    char* data = nullptr;
    size_t len = 0;
    size_t got = 0;
    bool checked = false;  // the pending header matched tag and length
    bool done = true;
  };

  Status CheckPeer(int peer, const char* what) const;
  Status SelfCopy(uint32_t send_tag, const void* send_data, size_t send_len, uint32_t recv_tag, void* recv_data,
                  size_t recv_len);
  Status WriteFrame(int peer, uint32_t kind, uint32_t tag, const void* data, size_t len);
  Status RunOps(SendOp* s, RecvOp* r);
  Status ProgressSend(SendOp* s, bool* progressed);
  Status ProgressRecv(RecvOp* r, bool* progressed);
  Status TimeoutError(const SendOp& s, const RecvOp& r) const;

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
};

}  // namespace hvdlite
