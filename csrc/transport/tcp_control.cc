// TcpTransport control plane (frame reader, control queue, WaitControl),
// failure handling, Depart / Close, and CreateTcpTransport.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/fd_limit.h"
#include "common/logging.h"
#include "common/socket_util.h"
#include "rendezvous/store.h"
#include "transport/tcp_transport.h"

namespace hvdlite {

using namespace tcp_wire;

Status TcpTransport::Pump(int peer, bool* progressed) {
  Peer& p = peers_[peer];
  for (int i = 0; i < p.nconn; ++i) HVD_RETURN_IF_ERROR(PumpConn(peer, &p.conn[i], progressed));
  bool all_eof = p.nconn > 0;
  for (int i = 0; i < p.nconn; ++i) all_eof = all_eof && p.conn[i].eof;
  p.closed = p.departed && all_eof;
  return Status::OK();
}

Status TcpTransport::PumpConn(int peer, Conn* c, bool* progressed) {
  Peer& p = peers_[peer];
  while (!c->data_pending && !c->eof) {
    char* dst;
    size_t want;
    if (c->in_payload) {
      if (c->payload_got == c->payload.size()) {
        HVD_RETURN_IF_ERROR(OnPayload(peer, c));
        continue;
      }
      dst = &c->payload[c->payload_got];
      want = c->payload.size() - c->payload_got;
    } else {
      dst = reinterpret_cast<char*>(&c->hdr) + c->hdr_got;
      want = sizeof(FrameHeader) - c->hdr_got;
    }
    ssize_t n = ::recv(c->fd, dst, want, 0);
    if (n > 0) {
      *progressed = true;
      if (c->in_payload) {
        c->payload_got += size_t(n);
      } else if ((c->hdr_got += size_t(n)) == sizeof(FrameHeader)) {
        HVD_RETURN_IF_ERROR(OnHeader(peer, c));
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::OK();
    int err = n == 0 ? 0 : errno;
    bool at_boundary = !c->in_payload && c->hdr_got == 0;
    if (p.departed && at_boundary && (err == 0 || err == ECONNRESET)) {
      c->eof = true;  // a departed peer going away is not an error
      return Status::OK();
    }
    return PeerLost(peer, err);
  }
  return Status::OK();
}

Status TcpTransport::OnHeader(int peer, Conn* c) {
  Peer& p = peers_[peer];
  const FrameHeader& h = c->hdr;
  if (h.kind == kData) {
    c->data_pending = true;  // hdr_got stays full until the matching Recv consumes it
    return Status::OK();
  }
  bool ok_len = (h.kind == kControl && h.length <= kMaxControlLen) ||
                (h.kind == kAbort && h.length <= kMaxAbortLen) || (h.kind == kDepart && h.length == 0) ||
                (h.kind == kNudge && h.length == 0);
  if (!ok_len) {
    std::ostringstream os;
    os << "rank " << rank_ << " received a corrupt frame from rank " << peer << " (kind 0x" << std::hex
       << h.kind << std::dec << ", length " << h.length << ")";
    return Status::Internal(os.str());
  }
  c->hdr_got = 0;
  if (h.kind == kNudge) {
    nudged_ = true;
    return Status::OK();
  }
  if (h.kind == kDepart) {
    departures_ += p.departed ? 0 : 1;
    p.departed = true;
    return Status::OK();
  }
  c->in_payload = true;
  c->payload.assign(size_t(h.length), '\0');
  c->payload_got = 0;
  return Status::OK();
}

Status TcpTransport::OnPayload(int peer, Conn* c) {
  Peer& p = peers_[peer];
  c->in_payload = false;
  if (c->hdr.kind == kAbort) {
    return Status::Aborted(Who(peer) + " failed: " + c->payload);
  }
  p.control.push_back(std::move(c->payload));
  c->payload = std::string();
  return Status::OK();
}

Status TcpTransport::PeerLost(int peer, int err) const {
  std::string who = Who(peer);
  if (err == ETIMEDOUT) {
    return Status::Aborted(who +
                           " stopped answering (no reply to TCP keepalive probes for several seconds: "
                           "its host is down or unreachable, or the network between us failed)");
  }
  if (err != 0 && err != ECONNRESET && err != EPIPE) {
    return Status::Aborted("connection to " + who + " failed: " + net::ErrnoString(err));
  }
  if (peers_[peer].departed) return Status::Aborted(who + " has shut down");
  return Status::Aborted(who + " closed its connection (the process exited or crashed?)");
}

Status TcpTransport::CheckHeartbeat() const {
  const int q = heartbeat_ != nullptr ? heartbeat_->frozen() : -1;
  if (q < 0) return Status::OK();
  std::ostringstream os;
  os << Who(q) << " stopped responding: no heartbeat from it for " << heartbeat_->bound_s()
     << " s (its process is stopped or hung: SIGSTOP, a debugger, a call that blocks every thread; or its "
        "host or the network to it went silent; HVDLITE_LIVENESS_SECONDS sets this bound)";
  return Status::Aborted(os.str());
}

Status TcpTransport::Fail(const Status& st) {
  if (broken_.ok()) {
    broken_ = st;
    HVD_LOG(kDebug, "transport broken: " << st.message());
    if (!closed_) BroadcastAbort(st.message());
  }
  return broken_;
}

// Best effort, never blocks: peers blocked on this rank learn why it stopped.
void TcpTransport::BroadcastAbort(const std::string& reason) {
  std::string frame(sizeof(FrameHeader), '\0');
  std::string text = reason.substr(0, kMaxAbortLen);
  FrameHeader h{kAbort, 0, uint64_t(text.size())};
  std::memcpy(&frame[0], &h, sizeof(h));
  frame += text;
  for (Peer& p : peers_) {
    for (int i = 0; i < p.nconn; ++i) {
      Conn& c = p.conn[i];
      if (c.fd < 0) continue;
      if (!(i == p.send && p.send_mid_frame) && !p.closed) {
        ssize_t n = ::send(c.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n;
      }
      ::shutdown(c.fd, SHUT_WR);  // readers see EOF right after the ABORT frame
    }
  }
}

Status TcpTransport::SendControl(int peer, const std::string& payload) {
  if (!broken_.ok()) return broken_;
  HVD_RETURN_IF_ERROR(CheckPeer(peer, "control"));
  if (payload.size() > kMaxControlLen) return Status::InvalidArgument("control message larger than 1 GiB");
  HVD_RETURN_IF_ERROR(EnsureSendConn(peer));
  SendOp s = SendOp::Control(peer, payload);
  RecvOp r;
  Status st = RunOps(&s, &r);
  return st.ok() ? st : Fail(st);
}

Status TcpTransport::WaitControl(int wake_fd, int timeout_ms, std::vector<ControlMessage>* out) {
  bool woken = false;
  return WaitImpl(wake_fd, timeout_ms, -1, -1, false, out, &woken);
}

Status TcpTransport::WaitEvents(int wake_fd, int timeout_ms, int writable_peer, int readable_peer,
                                std::vector<ControlMessage>* out, bool* woken) {
  return WaitImpl(wake_fd, timeout_ms, writable_peer, readable_peer, true, out, woken);
}

// The poll loop behind WaitControl and WaitEvents. any_progress: return once
// a byte arrived from any peer, a NUDGE came, writable_peer can be written, or
// readable_peer has more bytes (also while its data message is half consumed:
// without this a receiver mid-message slept until its timeout).
Status TcpTransport::WaitImpl(int wake_fd, int timeout_ms, int writable_peer, int readable_peer,
                              bool any_progress, std::vector<ControlMessage>* out, bool* woken) {
  if (!broken_.ok()) return broken_;
  if (timeout_ms < 0) return Status::InvalidArgument("WaitControl needs a bounded timeout_ms");
  Deadline deadline = Deadline::After(timeout_ms / 1000.0);
  bool have = false;
  for (int q : linked_) have = have || !peers_[q].control.empty();
  int wait_ms = have ? 0 : timeout_ms;
  std::vector<pollfd>& pfds = poll_fds_;
  std::vector<int>& owners = poll_owners_;
  if (any_progress) nudged_ = false;
  for (;;) {
    AdoptAccepted();
    pfds.clear();
    owners.clear();
    for (int q : linked_) {
      const Peer& p = peers_[q];
      if (p.closed) continue;
      for (int i = 0; i < p.nconn; ++i) {
        const Conn& c = p.conn[i];
        if (c.eof) continue;
        short events = c.data_pending && q != readable_peer ? 0 : POLLIN;
        if (q == writable_peer && i == p.send) events |= POLLOUT;
        if (events == 0) continue;
        pfds.push_back(pollfd{c.fd, events, 0});
        owners.push_back(q);
      }
    }
    // The connector's doorbell: a peer that connects may already be sending.
    const size_t doorbell = pfds.size();
    if (connector_ != nullptr) pfds.push_back(pollfd{connector_->wake_fd(), POLLIN, 0});
    const size_t wake_at = pfds.size();
    if (wake_fd >= 0) pfds.push_back(pollfd{wake_fd, POLLIN, 0});
    if (heartbeat_fd() >= 0) pfds.push_back(pollfd{heartbeat_fd(), POLLIN, 0});  // checked below
    int n = ::poll(pfds.data(), pfds.size(), wait_ms);
    if (n < 0 && errno != EINTR) return Fail(Status::Internal("poll failed: " + net::ErrnoString(errno)));
    Status beat = CheckHeartbeat();
    if (!beat.ok()) return Fail(beat);
    bool progressed = false;
    for (size_t i = 0; n > 0 && i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      if (i >= wake_at) {
        *woken = *woken || (wake_fd >= 0 && i == wake_at);
        continue;
      }
      if (i == doorbell) {
        progressed = true;  // new sockets are taken at the top of the loop
        continue;
      }
      if (owners[i] == writable_peer && (pfds[i].revents & (POLLOUT | POLLERR | POLLHUP))) progressed = true;
      if (owners[i] == readable_peer && (pfds[i].revents & (POLLIN | POLLERR | POLLHUP))) progressed = true;
      Status st = Pump(owners[i], &progressed);
      if (!st.ok()) return Fail(st);
    }
    for (int q : linked_) {
      Peer& p = peers_[q];
      while (!p.control.empty()) {
        out->push_back(ControlMessage{q, std::move(p.control.front())});
        p.control.pop_front();
        have = true;
      }
    }
    if (have || *woken || deadline.expired() || (any_progress && (progressed || nudged_)))
      return Status::OK();
    wait_ms = deadline.RemainingMs();
  }
}

// Best effort and never blocking: a sleeping peer also wakes on its own
// timeout, so a NUDGE that does not fit the socket buffer is simply dropped.
void TcpTransport::Nudge(int peer) {
  Peer& p = peers_[peer];
  if (closed_ || p.send < 0 || p.closed || p.send_mid_frame) return;
  const int fd = p.conn[p.send].fd;
  FrameHeader h{kNudge, 0, 0};
  ssize_t n;
  do {
    n = ::send(fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  // A partial header would corrupt the stream: finish it (16 bytes, bounded).
  if (n > 0 && size_t(n) < sizeof(h)) {
    Status st = net::WriteExact(fd, reinterpret_cast<const char*>(&h) + n, sizeof(h) - size_t(n),
                                Deadline::After(io_timeout_s_));
    if (!st.ok()) Fail(st);
  }
}

void TcpTransport::Depart() {
  if (closed_ || departed_ || !broken_.ok()) return;
  departed_ = true;
  Deadline deadline = Deadline::After(std::min(io_timeout_s_, 2.0));
  FrameHeader h{kDepart, 0, 0};
  for (Peer& p : peers_) {
    if (p.send < 0 || p.send_mid_frame || p.closed) continue;
    Status st = net::WriteExact(p.conn[p.send].fd, &h, sizeof(h), deadline);
    if (!st.ok()) HVD_LOG(kDebug, "could not tell a peer this rank departs: " << st.message());
  }
}

bool TcpTransport::PeerDeparted(int peer) const { return peer >= 0 && peer < size_ && peers_[peer].departed; }

void TcpTransport::Close() {
  if (closed_) return;
  closed_ = true;
  if (broken_.ok()) broken_ = Status::Aborted("rank " + std::to_string(rank_) + "'s transport is closed");
  for (Peer& p : peers_) {
    for (int c = 0; c < p.nconn; ++c) {
      int& fd = p.conn[c].fd;
      if (fd < 0) continue;
      // Read what is pending so close() sends FIN after our last frame, not a
      // reset that could discard it (bounded: a streaming peer cannot hold us).
      char sink[64 * 1024];
      for (int i = 0; i < 64 && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
      }
      ::shutdown(fd, SHUT_RDWR);  // also when a forked child shares the fd
      net::CloseFd(&fd);
    }
  }
  if (heartbeat_ != nullptr) heartbeat_->Stop();
  if (connector_ != nullptr) connector_->Stop();
}

std::vector<int> RingNeighbours(int rank, int size) {
  std::vector<int> out;
  if (size < 2) return out;
  out.push_back((rank + 1) % size);
  if (size > 2) out.push_back((rank + size - 1) % size);
  return out;
}

// Connects to every eager peer above this rank, then waits for those below
// to connect here: one socket per eager pair, opened in a fixed direction, and
// a job whose ranks cannot reach each other fails here, at once.
Status TcpTransport::AwaitPeers(const std::vector<int>& peers, const Deadline& deadline) {
  for (int q : peers) {
    if (q <= rank_ || peers_[q].send >= 0) continue;
    int fd = -1;
    HVD_RETURN_IF_ERROR(connector_->Connect(q, deadline, &fd));
    AddConn(q, fd);
  }
  std::vector<pollfd> pfd(1);
  for (;;) {
    AdoptAccepted();
    std::vector<int> missing;
    for (int q : peers) {
      if (q < rank_ && peers_[q].nconn == 0) missing.push_back(q);
    }
    if (missing.empty()) return Status::OK();
    if (deadline.expired()) {
      std::ostringstream os;
      os << "rank " << rank_ << " timed out waiting for ranks [";
      for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
      os << "] to connect (did they start? is this host reachable from theirs? same job secret?)";
      return Status::Timeout(os.str());
    }
    pfd[0] = pollfd{connector_->wake_fd(), POLLIN, 0};
    if (::poll(pfd.data(), 1, std::max(1, deadline.RemainingMs())) < 0 && errno != EINTR) {
      return Status::Internal("poll failed: " + net::ErrnoString(errno));
    }
  }
}

Status TcpTransport::StartHeartbeat(Store* store, const std::string& prefix,
                                    const std::string& advertise_host, const std::string& secret,
                                    int liveness_s, const Deadline& connect_deadline) {
  if (size_ < 2 || heartbeat_ != nullptr) return Status::OK();
  heartbeat_.reset(new Heartbeat(rank_, size_, std::max(2, liveness_s)));
  return heartbeat_->Start(store, prefix, advertise_host, secret, liveness_s, RingNeighbours(rank_, size_),
                           connect_deadline);
}

Status TcpTransport::AwaitFirstBeats(const Deadline& deadline) {
  return heartbeat_ != nullptr ? heartbeat_->AwaitFirstBeats(deadline) : Status::OK();
}

Status NewTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                       const std::string& advertise_host, const std::string& secret, double connect_timeout_s,
                       double io_timeout_s, int liveness_s, const std::vector<int>& eager,
                       const std::vector<std::string>& hosts, std::unique_ptr<TcpTransport>* out) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument("CreateTcpTransport: rank " + std::to_string(rank) + " is outside size " +
                                   std::to_string(size));
  }
  if (size > 1 && store == nullptr) return Status::InvalidArgument("CreateTcpTransport needs a store");
  if (io_timeout_s <= 0 || connect_timeout_s <= 0) {
    return Status::InvalidArgument("CreateTcpTransport: timeouts must be positive");
  }
  // Sockets to the eager peers now, more on demand (kSpareOpenFiles covers a few dozen).
  HVD_RETURN_IF_ERROR(EnsureOpenFiles(
      static_cast<uint64_t>(eager.size()) + 1,
      "rank " + std::to_string(rank) + "'s TCP transport to " + std::to_string(eager.size()) + " peers"));
  std::unique_ptr<PeerConnector> connector;
  if (size > 1) {
    connector.reset(new PeerConnector(store, prefix, rank, size, secret, liveness_s));
    HVD_RETURN_IF_ERROR(connector->Start(advertise_host));
  }
  out->reset(new TcpTransport(rank, size, std::move(connector), std::vector<int>(size, -1), hosts,
                              connect_timeout_s, io_timeout_s));
  if (size == 1) return Status::OK();
  const Deadline deadline = Deadline::After(connect_timeout_s);
  Status st = (*out)->StartHeartbeat(store, prefix, advertise_host, secret, liveness_s, deadline);
  if (st.ok()) st = (*out)->AwaitPeers(eager, deadline);
  if (st.ok()) st = (*out)->AwaitFirstBeats(deadline);
  if (!st.ok()) out->reset();
  return st;
}

Status CreateTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                          const std::string& advertise_host, const std::string& secret,
                          double connect_timeout_s, double io_timeout_s, std::unique_ptr<Transport>* out,
                          int liveness_s) {
  std::unique_ptr<TcpTransport> tcp;
  HVD_RETURN_IF_ERROR(NewTcpTransport(store, prefix, rank, size, advertise_host, secret, connect_timeout_s,
                                      io_timeout_s, liveness_s, RingNeighbours(rank, size), {}, &tcp));
  *out = std::move(tcp);
  return Status::OK();
}

}  // namespace hvdlite
