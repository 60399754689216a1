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
#include "transport/tcp_mesh.h"
#include "transport/tcp_transport.h"

namespace hvdlite {

using namespace tcp_wire;

Status TcpTransport::Pump(int peer, bool* progressed) {
  Peer& p = peers_[peer];
  while (!p.data_pending && !p.closed) {
    char* dst;
    size_t want;
    if (p.in_payload) {
      if (p.payload_got == p.payload.size()) {
        HVD_RETURN_IF_ERROR(OnPayload(peer));
        continue;
      }
      dst = &p.payload[p.payload_got];
      want = p.payload.size() - p.payload_got;
    } else {
      dst = reinterpret_cast<char*>(&p.hdr) + p.hdr_got;
      want = sizeof(FrameHeader) - p.hdr_got;
    }
    ssize_t n = ::recv(p.fd, dst, want, 0);
    if (n > 0) {
      *progressed = true;
      if (p.in_payload) {
        p.payload_got += size_t(n);
      } else if ((p.hdr_got += size_t(n)) == sizeof(FrameHeader)) {
        HVD_RETURN_IF_ERROR(OnHeader(peer));
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::OK();
    int err = n == 0 ? 0 : errno;
    bool at_boundary = !p.in_payload && p.hdr_got == 0;
    if (p.departed && at_boundary && (err == 0 || err == ECONNRESET)) {
      p.closed = true;  // a departed peer going away is not an error
      return Status::OK();
    }
    return PeerLost(peer, err);
  }
  return Status::OK();
}

Status TcpTransport::OnHeader(int peer) {
  Peer& p = peers_[peer];
  const FrameHeader& h = p.hdr;
  if (h.kind == kData) {
    p.data_pending = true;  // hdr_got stays full until the matching Recv consumes it
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
  p.hdr_got = 0;
  if (h.kind == kNudge) {
    nudged_ = true;
    return Status::OK();
  }
  if (h.kind == kDepart) {
    p.departed = true;
    return Status::OK();
  }
  p.in_payload = true;
  p.payload.assign(size_t(h.length), '\0');
  p.payload_got = 0;
  return Status::OK();
}

Status TcpTransport::OnPayload(int peer) {
  Peer& p = peers_[peer];
  p.in_payload = false;
  if (p.hdr.kind == kAbort) {
    return Status::Aborted("rank " + std::to_string(peer) + " failed: " + p.payload);
  }
  p.control.push_back(std::move(p.payload));
  p.payload = std::string();
  return Status::OK();
}

Status TcpTransport::PeerLost(int peer, int err) const {
  std::string who = "rank " + std::to_string(peer);
  if (err != 0 && err != ECONNRESET && err != EPIPE) {
    return Status::Aborted("connection to " + who + " failed: " + net::ErrnoString(err));
  }
  if (peers_[peer].departed) return Status::Aborted(who + " has shut down");
  return Status::Aborted(who + " closed its connection (the process exited or crashed?)");
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
    if (p.fd < 0) continue;
    if (!p.send_mid_frame && !p.closed) {
      ssize_t n = ::send(p.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)n;
    }
    ::shutdown(p.fd, SHUT_WR);  // readers see EOF right after the ABORT frame
  }
}

Status TcpTransport::SendControl(int peer, const std::string& payload) {
  if (!broken_.ok()) return broken_;
  HVD_RETURN_IF_ERROR(CheckPeer(peer, "control"));
  if (payload.size() > kMaxControlLen) return Status::InvalidArgument("control message larger than 1 GiB");
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
  for (Peer& p : peers_) have = have || !p.control.empty();
  int wait_ms = have ? 0 : timeout_ms;
  std::vector<pollfd>& pfds = poll_fds_;
  std::vector<int>& owners = poll_owners_;
  if (any_progress) nudged_ = false;
  for (;;) {
    pfds.clear();
    owners.clear();
    for (int q = 0; q < size_; ++q) {
      const Peer& p = peers_[q];
      if (p.fd < 0 || p.closed) continue;
      short events = p.data_pending && q != readable_peer ? 0 : POLLIN;
      if (q == writable_peer) events |= POLLOUT;
      if (events == 0) continue;
      pfds.push_back(pollfd{p.fd, events, 0});
      owners.push_back(q);
    }
    if (wake_fd >= 0) pfds.push_back(pollfd{wake_fd, POLLIN, 0});
    int n = ::poll(pfds.data(), pfds.size(), wait_ms);
    if (n < 0 && errno != EINTR) return Fail(Status::Internal("poll failed: " + net::ErrnoString(errno)));
    bool progressed = false;
    for (size_t i = 0; n > 0 && i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      if (i == owners.size()) {
        *woken = true;
        continue;
      }
      if (owners[i] == writable_peer && (pfds[i].revents & (POLLOUT | POLLERR | POLLHUP))) progressed = true;
      if (owners[i] == readable_peer && (pfds[i].revents & (POLLIN | POLLERR | POLLHUP))) progressed = true;
      if (peers_[owners[i]].data_pending) continue;
      Status st = Pump(owners[i], &progressed);
      if (!st.ok()) return Fail(st);
    }
    for (int q = 0; q < size_; ++q) {
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
  if (closed_ || p.fd < 0 || p.closed || p.send_mid_frame) return;
  FrameHeader h{kNudge, 0, 0};
  ssize_t n;
  do {
    n = ::send(p.fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  // A partial header would corrupt the stream: finish it (16 bytes, bounded).
  if (n > 0 && size_t(n) < sizeof(h)) {
    Status st = net::WriteExact(p.fd, reinterpret_cast<const char*>(&h) + n, sizeof(h) - size_t(n),
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
    if (p.fd < 0 || p.send_mid_frame || p.closed) continue;
    Status st = net::WriteExact(p.fd, &h, sizeof(h), deadline);
    if (!st.ok()) HVD_LOG(kDebug, "could not tell a peer this rank departs: " << st.message());
  }
}

bool TcpTransport::PeerDeparted(int peer) const { return peer >= 0 && peer < size_ && peers_[peer].departed; }

void TcpTransport::Close() {
  if (closed_) return;
  closed_ = true;
  if (broken_.ok()) broken_ = Status::Aborted("rank " + std::to_string(rank_) + "'s transport is closed");
  for (Peer& p : peers_) {
    if (p.fd < 0) continue;
    // Read what is pending so close() sends FIN after our last frame, not a
    // reset that could discard it (bounded: a streaming peer cannot hold us).
    char sink[64 * 1024];
    for (int i = 0; i < 64 && ::recv(p.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
    }
    ::shutdown(p.fd, SHUT_RDWR);  // also when a forked child shares the fd
    net::CloseFd(&p.fd);
  }
}

Status NewTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                       const std::string& advertise_host, const std::string& secret, double connect_timeout_s,
                       double io_timeout_s, std::unique_ptr<TcpTransport>* out) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument("CreateTcpTransport: rank " + std::to_string(rank) + " is outside size " +
                                   std::to_string(size));
  }
  if (size > 1 && store == nullptr) return Status::InvalidArgument("CreateTcpTransport needs a store");
  if (io_timeout_s <= 0 || connect_timeout_s <= 0) {
    return Status::InvalidArgument("CreateTcpTransport: timeouts must be positive");
  }
  // One socket per peer: a job larger than the open-file limit fails here, at once.
  HVD_RETURN_IF_ERROR(EnsureOpenFiles(
      static_cast<uint64_t>(size),
      "rank " + std::to_string(rank) + "'s TCP transport to " + std::to_string(size - 1) + " peers"));
  std::vector<int> fds;
  HVD_RETURN_IF_ERROR(
      BuildTcpMesh(store, prefix, rank, size, advertise_host, secret, connect_timeout_s, &fds));
  out->reset(new TcpTransport(rank, size, std::move(fds), io_timeout_s));
  return Status::OK();
}

Status CreateTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                          const std::string& advertise_host, const std::string& secret,
                          double connect_timeout_s, double io_timeout_s, std::unique_ptr<Transport>* out) {
  std::unique_ptr<TcpTransport> tcp;
  HVD_RETURN_IF_ERROR(NewTcpTransport(store, prefix, rank, size, advertise_host, secret, connect_timeout_s,
                                      io_timeout_s, &tcp));
  *out = std::move(tcp);
  return Status::OK();
}

}  // namespace hvdlite
