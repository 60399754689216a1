// TcpTransport data path: Send / Recv / SendRecv over nonblocking sockets,
// progressed together with poll(). Control plane and lifecycle: tcp_control.cc.
#include "transport/tcp_transport.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "common/logging.h"
#include "common/socket_util.h"

namespace hvdlite {

using namespace tcp_wire;

TcpTransport::TcpTransport(int rank, int size, std::unique_ptr<PeerConnector> connector, std::vector<int> fds,
                           std::vector<std::string> hosts, double connect_timeout_s, double io_timeout_s)
    : rank_(rank),
      size_(size),
      connector_(std::move(connector)),
      hosts_(std::move(hosts)),
      connect_timeout_s_(connect_timeout_s),
      io_timeout_s_(io_timeout_s),
      peers_(size) {
  for (int p = 0; p < size; ++p) {
    if (fds[p] >= 0) AddConn(p, fds[p]);
  }
}

void TcpTransport::AddConn(int peer, int fd) {
  Peer& p = peers_[peer];
  if (p.nconn == 2) {  // cannot happen with the connect rule; never leak the socket
    HVD_LOG(kWarning, "rank " << rank_ << ": dropped a third connection from rank " << peer);
    net::CloseFd(&fd);
    return;
  }
  if (p.nconn == 0) linked_.push_back(peer);
  p.conn[p.nconn] = Conn();
  p.conn[p.nconn].fd = fd;
  if (p.send < 0) p.send = p.nconn;
  ++p.nconn;
}

void TcpTransport::AdoptAccepted() {
  if (connector_ == nullptr) return;
  adopted_.clear();
  connector_->TakeAccepted(&adopted_);
  for (auto& a : adopted_) AddConn(a.first, a.second);
}

Status TcpTransport::EnsureSendConn(int peer) {
  if (!broken_.ok()) return broken_;
  AdoptAccepted();
  if (peers_[peer].send >= 0) return Status::OK();
  if (connector_ == nullptr) return Status::Internal("rank " + std::to_string(rank_) + " has no connector");
  int fd = -1;
  Status st = connector_->Connect(peer, Deadline::After(connect_timeout_s_), &fd);
  if (!st.ok()) return Fail(st.WithContext("opening a connection to " + Who(peer)));
  AdoptAccepted();  // a socket the peer opened meanwhile is read, but ours is the one we send on
  Peer& p = peers_[peer];
  AddConn(peer, fd);
  p.send = p.nconn - 1;
  return Status::OK();
}

TcpTransport::Conn* TcpTransport::DataConn(int peer) {
  Peer& p = peers_[peer];
  for (int i = 0; i < p.nconn; ++i) {
    if (p.conn[i].data_pending) return &p.conn[i];
  }
  return nullptr;
}

std::string TcpTransport::Who(int peer) const {
  std::string who = "rank " + std::to_string(peer);
  if (peer >= 0 && peer < int(hosts_.size()) && !hosts_[peer].empty()) {
    who += " (host " + hosts_[peer].substr(0, hosts_[peer].find('/')) + ")";  // the name, not the boot id
  }
  return who;
}

bool TcpTransport::Connected(int peer) const { return peer >= 0 && peer < size_ && peers_[peer].nconn > 0; }

int TcpTransport::open_sockets() const {
  int n = 0;
  for (const Peer& p : peers_) {
    for (int i = 0; i < p.nconn; ++i) n += p.conn[i].fd >= 0 ? 1 : 0;
  }
  return n;
}

TcpTransport::~TcpTransport() { Close(); }

Status TcpTransport::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    std::ostringstream os;
    os << "rank " << rank_ << ": invalid " << what << " peer " << peer << " (size " << size_ << ")";
    return Status::InvalidArgument(os.str());
  }
  return Status::OK();
}

Status TcpTransport::Send(int peer, uint32_t tag, const void* data, size_t len) {
  return SendRecv(peer, tag, data, len, -1, 0, nullptr, 0);
}

Status TcpTransport::Recv(int peer, uint32_t tag, void* data, size_t len) {
  return SendRecv(-1, 0, nullptr, 0, peer, tag, data, len);
}

// A rank exchanging with itself (both sides name this rank): a plain copy.
Status TcpTransport::SelfCopy(uint32_t send_tag, const void* send_data, size_t send_len, uint32_t recv_tag,
                              void* recv_data, size_t recv_len) {
  if (send_tag != recv_tag || send_len != recv_len) {
    std::ostringstream os;
    os << "rank " << rank_ << " sends itself tag " << send_tag << " (" << send_len
       << " bytes) but expects tag " << recv_tag << " (" << recv_len << " bytes)";
    return Fail(Status::Internal(os.str()));
  }
  if (send_len > 0 && send_data != recv_data) std::memmove(recv_data, send_data, send_len);
  return Status::OK();
}

// Fills the ops for a SendRecv(Reduce) without moving a byte (peer -1: no such side).
Status TcpTransport::PrepareOps(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                                int recv_peer, uint32_t recv_tag, void* recv_data, size_t recv_len,
                                const Reducer* reducer, SendOp* s, RecvOp* r) const {
  if (send_peer != -1) HVD_RETURN_IF_ERROR(CheckPeer(send_peer, "send"));
  if (recv_peer != -1) HVD_RETURN_IF_ERROR(CheckPeer(recv_peer, "receive"));
  *s = SendOp::Data(send_peer, send_tag, send_data, send_len);
  *r = RecvOp::Data(recv_peer, recv_tag, recv_data, recv_len, reducer);
  return Status::OK();
}

Status TcpTransport::SendRecv(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                              int recv_peer, uint32_t recv_tag, void* recv_data, size_t recv_len) {
  if (!broken_.ok()) return broken_;
  if (send_peer == rank_ && recv_peer == rank_) {
    return SelfCopy(send_tag, send_data, send_len, recv_tag, recv_data, recv_len);
  }
  SendOp s;
  RecvOp r;
  HVD_RETURN_IF_ERROR(PrepareOps(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, recv_data,
                                 recv_len, nullptr, &s, &r));
  if (send_peer != -1) HVD_RETURN_IF_ERROR(EnsureSendConn(send_peer));
  Status st = RunOps(&s, &r);
  return st.ok() ? st : Fail(st);
}

Status TcpTransport::SendRecvReduce(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                                    int recv_peer, uint32_t recv_tag, void* recv_dst, size_t recv_len,
                                    const Reducer& reducer) {
  if (!broken_.ok()) return broken_;
  if (send_peer == rank_ || recv_peer == rank_) {  // rare: the generic path handles self-exchange
    return Transport::SendRecvReduce(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, recv_dst,
                                     recv_len, reducer);
  }
  SendOp s;
  RecvOp r;
  HVD_RETURN_IF_ERROR(PrepareOps(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, recv_dst,
                                 recv_len, &reducer, &s, &r));
  if (send_peer != -1) HVD_RETURN_IF_ERROR(EnsureSendConn(send_peer));
  Status st = RunOps(&s, &r);
  return st.ok() ? st : Fail(st);
}

Status TcpTransport::StepOps(SendOp* s, RecvOp* r, bool* progressed) {
  if (!broken_.ok()) return broken_;
  HVD_RETURN_IF_ERROR(CheckHeartbeat());
  if (!s->done && peers_[s->peer].send < 0) HVD_RETURN_IF_ERROR(EnsureSendConn(s->peer));
  if (!s->done) HVD_RETURN_IF_ERROR(ProgressSend(s, progressed));
  if (!r->done) HVD_RETURN_IF_ERROR(ProgressRecv(r, progressed));
  return Status::OK();
}

// Drives both directions until done; fails when no byte moves for io_timeout_s.
Status TcpTransport::RunOps(SendOp* s, RecvOp* r) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_progress = Clock::now();
  for (;;) {
    HVD_RETURN_IF_ERROR(CheckHeartbeat());
    bool progressed = false;
    if (!s->done) HVD_RETURN_IF_ERROR(ProgressSend(s, &progressed));
    if (!r->done) HVD_RETURN_IF_ERROR(ProgressRecv(r, &progressed));
    if (s->done && r->done) return Status::OK();
    Clock::time_point now = Clock::now();
    if (progressed) last_progress = now;
    double idle_s = std::chrono::duration<double>(now - last_progress).count();
    double left_ms = std::ceil((io_timeout_s_ - idle_s) * 1000.0);
    if (left_ms <= 0) return TimeoutError(*s, *r);
    // The send socket, each socket of the receive peer, the connector's
    // doorbell while that peer has not connected yet, and the heartbeat's.
    pollfd pfds[5];
    nfds_t n = 0;
    if (!s->done) pfds[n++] = pollfd{peers_[s->peer].conn[peers_[s->peer].send].fd, POLLOUT, 0};
    if (!r->done) {
      const Peer& rp = peers_[r->peer];
      for (int i = 0; i < rp.nconn; ++i) {
        const int fd = rp.conn[i].fd;
        if (n == 1 && pfds[0].fd == fd) {
          pfds[0].events |= POLLIN;
        } else {
          pfds[n++] = pollfd{fd, POLLIN, 0};
        }
      }
      if (connector_ != nullptr) pfds[n++] = pollfd{connector_->wake_fd(), POLLIN, 0};
    }
    if (heartbeat_fd() >= 0) pfds[n++] = pollfd{heartbeat_fd(), POLLIN, 0};  // checked at the loop's top
    int wait_ms = left_ms > 1e9 ? 1000000000 : int(left_ms);
    if (::poll(pfds, n, wait_ms) < 0 && errno != EINTR) {
      return Status::Internal("poll failed: " + net::ErrnoString(errno));
    }
    AdoptAccepted();
  }
}

// Writes the frame header (built from the op: kind, tag, length) and the
// payload together, as far as the socket takes them.
Status TcpTransport::ProgressSend(SendOp* s, bool* progressed) {
  Peer& p = peers_[s->peer];
  const int fd = p.conn[p.send].fd;
  constexpr size_t hdr_len = sizeof(FrameHeader);
  const FrameHeader hdr{s->kind == MessageKind::kControl ? kControl : kData, s->tag, uint64_t(s->len)};
  while (s->header_sent < hdr_len || s->sent < s->len) {
    iovec iov[2];
    int cnt = 0;
    if (s->header_sent < hdr_len) {
      iov[cnt++] = iovec{const_cast<char*>(reinterpret_cast<const char*>(&hdr)) + s->header_sent,
                         hdr_len - s->header_sent};
    }
    if (s->sent < s->len) iov[cnt++] = iovec{const_cast<char*>(s->data) + s->sent, s->len - s->sent};
    msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = cnt;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      const size_t to_header = std::min(size_t(n), hdr_len - s->header_sent);
      s->header_sent += to_header;
      s->sent += size_t(n) - to_header;
      *progressed = true;
      p.send_mid_frame = s->header_sent < hdr_len || s->sent < s->len;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::OK();
    return PeerLost(s->peer, n < 0 ? errno : EPIPE);
  }
  s->done = true;
  return Status::OK();
}

Status TcpTransport::ProgressRecv(RecvOp* r, bool* progressed) {
  Conn* c = DataConn(r->peer);
  if (c == nullptr) {
    HVD_RETURN_IF_ERROR(Pump(r->peer, progressed));
    if (peers_[r->peer].closed) return PeerLost(r->peer, 0);
    c = DataConn(r->peer);
    if (c == nullptr) return Status::OK();  // would block
  }
  if (!r->checked) {
    if (c->hdr.tag != r->tag || c->hdr.length != r->len) {
      std::ostringstream os;
      os << "rank " << rank_ << " expected data tag " << r->tag << " (" << r->len << " bytes) from rank "
         << r->peer << " but received tag " << c->hdr.tag << " (" << c->hdr.length
         << " bytes): the ranks disagree on the order of operations";
      return Status::Internal(os.str());
    }
    r->checked = true;
  }
  if (r->reducer != nullptr) return ReceiveReducing(r, c, progressed);
  while (r->got < r->len) {
    ssize_t n = ::recv(c->fd, r->data + r->got, r->len - r->got, 0);
    if (n > 0) {
      r->got += size_t(n);
      *progressed = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return RecvStalled(r->peer, n);
  }
  return FinishReceive(r, c);
}

// A recv() that returned `n` <= 0 (not EINTR): OK when the socket is merely
// drained (try again after poll), PeerLost for EOF or a real error.
Status TcpTransport::RecvStalled(int peer, ssize_t n) const {
  if (n == 0) return PeerLost(peer, 0);
  if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
  return PeerLost(peer, errno);
}

// The whole payload has arrived: the peer's next frame header may be read.
Status TcpTransport::FinishReceive(RecvOp* r, Conn* c) {
  c->data_pending = false;
  c->hdr_got = 0;
  r->done = true;
  return Status::OK();
}

// The payload of a checked DATA frame, reduced into r->data piece by piece:
// bytes are read into scratch, and each full piece (whole elements: the piece
// size is a multiple of 64) or the message's tail is reduced while still in cache.
Status TcpTransport::ReceiveReducing(RecvOp* r, Conn* c, bool* progressed) {
  constexpr size_t kPiece = 256 << 10;
  if (reduce_scratch_.size() < kPiece) reduce_scratch_.resize(kPiece);
  while (r->got < r->len) {
    const size_t in_piece = r->got - r->reduced;
    const size_t want = std::min(kPiece - in_piece, r->len - r->got);
    ssize_t n = ::recv(c->fd, reduce_scratch_.data() + in_piece, want, 0);
    if (n > 0) {
      r->got += size_t(n);
      *progressed = true;
      if (r->got - r->reduced == kPiece || r->got == r->len) {
        HVD_RETURN_IF_ERROR(r->reducer->fn(r->reducer->ctx, r->data + r->reduced, reduce_scratch_.data(),
                                           r->got - r->reduced));
        r->reduced = r->got;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return RecvStalled(r->peer, n);
  }
  return FinishReceive(r, c);
}

Status TcpTransport::TimeoutError(const SendOp& s, const RecvOp& r) const {
  std::ostringstream os;
  os << "rank " << rank_ << ": no data moved for " << io_timeout_s_ << "s while";
  if (!s.done) {
    os << " sending to " << Who(s.peer) << " ("
       << (s.kind == MessageKind::kControl ? "control" : "tag " + std::to_string(s.tag)) << ", " << s.sent
       << " of " << s.len << " bytes sent)";
  }
  if (!s.done && !r.done) os << " and";
  if (!r.done) {
    os << " receiving from " << Who(r.peer) << " (tag " << r.tag << ", " << r.got << " of " << r.len
       << " bytes received" << (Connected(r.peer) ? "" : "; it never connected to this rank") << ")";
  }
  os << "; is that rank stalled, or did it skip this operation?";
  return Status::Timeout(os.str());
}

}  // namespace hvdlite
