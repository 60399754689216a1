// TcpTransport: the Transport over TCP connections opened on demand.
//
// Private to csrc/transport (others use CreateTcpTransport in transport.h).
// Frames are described in tcp_wire.h.
//
// Connections. At creation the transport connects to its "eager" peers (the
// factory's list: ring neighbours, and the shared-memory partners whose
// doorbell and liveness ride on TCP), lower rank to higher, and waits until
// each of them is up; every other pair connects when this rank first sends to
// that peer (PeerConnector, tcp_connect.h, accepts on its own thread, so the
// peer's engine need not take part). A receive from a peer with no connection
// waits for the peer to connect. When two ranks connect to each other at the
// same moment, the pair keeps both sockets: each rank sends every frame on the
// first socket it had for the pair (so each direction stays in order on one
// socket) and reads both. So a pair holds at most two sockets, and a rank
// holds sockets only to the peers its algorithms use.
//
// Each socket keeps a small receive state that survives between calls: a
// partially read frame header, a DATA header already parsed (left for the
// Recv that names its tag), a CONTROL payload being read. Each peer keeps the
// queue of complete control messages. The data path allocates nothing and
// waits only in poll().
//
// Liveness: every socket carries TCP keepalive and a user timeout
// (SetLiveness), so a peer whose host goes silent fails its sockets within
// liveness_s; a ring neighbour whose process stops while its sockets stay
// open misses its heartbeat (heartbeat.h) for liveness_s, which every wait of
// this transport polls for (CheckHeartbeat). The first failure aborts this
// transport, and the ABORT frame it sends to every connected peer carries the
// reason on (so a failure spreads over the connection graph, which the ring
// neighbours keep connected).
#pragma once
#include <poll.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/heartbeat.h"
#include "transport/stepped.h"
#include "transport/tcp_connect.h"
#include "transport/tcp_wire.h"
#include "transport/transport.h"

namespace hvdlite {

class TcpTransport : public SteppedTransport {
 public:
  // Takes ownership of the connector (started) and of the connected sockets:
  // fds[p] is a socket to p or -1 (fds[rank] == -1). hosts (size entries, or
  // empty) name each rank's host in error messages.
  TcpTransport(int rank, int size, std::unique_ptr<PeerConnector> connector, std::vector<int> fds,
               std::vector<std::string> hosts, double connect_timeout_s, double io_timeout_s);
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
  int departures() const override { return departures_; }
  bool Connected(int peer) const override;
  void Close() override;
  int open_sockets() const override;

  // Connects to every rank in `peers` above this one and waits until those
  // below have connected here (the eager set, see "Connections"); bounded by
  // `deadline`, whose expiry names the ranks that never connected.
  Status AwaitPeers(const std::vector<int>& peers, const Deadline& deadline);
  // Starts watching the ring neighbours (heartbeat.h) with bound liveness_s
  // (at least 2 s, like SetLiveness); before AwaitPeers. AwaitFirstBeats,
  // after it, returns once every neighbour beat (so init returns watched).
  Status StartHeartbeat(Store* store, const std::string& prefix, const std::string& advertise_host,
                        const std::string& secret, int liveness_s, const Deadline& connect_deadline);
  Status AwaitFirstBeats(const Deadline& deadline);

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
  // One socket to a peer and the frame being read from it.
  struct Conn {
    int fd = -1;
    tcp_wire::FrameHeader hdr{};  // the frame being received
    size_t hdr_got = 0;           // bytes of hdr read so far
    bool data_pending = false;    // hdr is a complete DATA header awaiting its Recv
    bool in_payload = false;      // reading a CONTROL/ABORT payload into `payload`
    std::string payload;
    size_t payload_got = 0;
    bool eof = false;  // the departed peer closed this socket
  };
  struct Peer {
    Conn conn[2];  // at most two: see "Connections" above
    int nconn = 0;
    int send = -1;                    // index of the conn this rank sends on (-1: none yet)
    std::deque<std::string> control;  // complete control messages, oldest first
    bool departed = false;            // the peer sent DEPART
    bool closed = false;              // departed, and every socket reached EOF
    bool send_mid_frame = false;      // a frame to this peer is partially written
  };

  Status CheckPeer(int peer, const char* what) const;
  // Aborted naming the neighbour the heartbeat found frozen, else OK (one
  // atomic load); returned unrecorded, like StepOps' errors.
  Status CheckHeartbeat() const;
  int heartbeat_fd() const { return heartbeat_ != nullptr ? heartbeat_->wake_fd() : -1; }
  Status SelfCopy(uint32_t send_tag, const void* send_data, size_t send_len, uint32_t recv_tag,
                  void* recv_data, size_t recv_len);
  Status WriteFrame(int peer, uint32_t kind, uint32_t tag, const void* data, size_t len);
  Status PrepareOps(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len, int recv_peer,
                    uint32_t recv_tag, void* recv_data, size_t recv_len, const Reducer* reducer, SendOp* s,
                    RecvOp* r) const;
  Status RunOps(SendOp* s, RecvOp* r);
  Status ProgressSend(SendOp* s, bool* progressed);
  Status ProgressRecv(RecvOp* r, bool* progressed);
  Status ReceiveReducing(RecvOp* r, Conn* c, bool* progressed);
  Status RecvStalled(int peer, ssize_t n) const;
  Status FinishReceive(RecvOp* r, Conn* c);
  Status WaitImpl(int wake_fd, int timeout_ms, int writable_peer, int readable_peer, bool any_progress,
                  std::vector<ControlMessage>* out, bool* woken);

  // Reads frames from each socket of `peer` without blocking until EAGAIN,
  // until a DATA header is parsed, or until EOF of a departed peer. Control
  // messages go to the peer's queue. *progressed is set when a byte was read.
  Status Pump(int peer, bool* progressed);
  Status PumpConn(int peer, Conn* c, bool* progressed);
  Status OnHeader(int peer, Conn* c);
  Status OnPayload(int peer, Conn* c);
  Status PeerLost(int peer, int err) const;
  // The socket of `peer` whose DATA header waits for a Recv (nullptr: none).
  Conn* DataConn(int peer);
  // Connects to `peer` unless this rank already has a socket to send on
  // (bounded by connect_timeout_s); the socket becomes the pair's send socket.
  Status EnsureSendConn(int peer);
  // Takes the connector's authenticated incoming sockets into peers_.
  void AdoptAccepted();
  void AddConn(int peer, int fd);
  std::string Who(int peer) const;

  // Records the first error, tells the peers (ABORT) and returns it.
  Status Fail(const Status& st);
  void BroadcastAbort(const std::string& reason);

  int rank_, size_;
  std::unique_ptr<PeerConnector> connector_;
  std::unique_ptr<Heartbeat> heartbeat_;  // null for one rank, and before StartHeartbeat
  std::vector<std::string> hosts_;
  double connect_timeout_s_;
  double io_timeout_s_;
  std::vector<std::pair<int, int>> adopted_;  // AdoptAccepted scratch
  std::vector<Peer> peers_;
  std::vector<int> linked_;  // peers with a socket, in the order they got one: the wait loops walk
                             // these, not every rank (O(connections) per wait, not O(size))
  Status broken_;
  bool closed_ = false;
  bool departed_ = false;
  std::vector<pollfd> poll_fds_;  // WaitControl scratch, reused to avoid allocating
  std::vector<int> poll_owners_;
  std::vector<char> reduce_scratch_;  // ReceiveReducing: one piece of an incoming message
  bool nudged_ = false;               // a NUDGE arrived since the last WaitEvents
  int departures_ = 0;                // peers whose DEPART arrived (departures())
};

// CreateTcpTransport's work, returning the concrete type (for the factory of
// the shared-memory transport, which keeps it as a SteppedTransport).
// `eager` lists the peers connected before this returns (see "Connections");
// `hosts` (size entries, or empty) names hosts in errors.
Status NewTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                       const std::string& advertise_host, const std::string& secret, double connect_timeout_s,
                       double io_timeout_s, int liveness_s, const std::vector<int>& eager,
                       const std::vector<std::string>& hosts, std::unique_ptr<TcpTransport>* out);

// The peers every rank connects at creation: its ring neighbours (rank +- 1),
// which keep the connection graph connected so a failure reaches every rank.
std::vector<int> RingNeighbours(int rank, int size);

}  // namespace hvdlite
