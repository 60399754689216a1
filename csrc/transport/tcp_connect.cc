// PeerConnector (tcp_connect.h): the listener, the accept thread and the
// connector side of the mutual HMAC handshake (wire layout in tcp_wire.h).
#include "transport/tcp_connect.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <algorithm>
#include <list>
#include <sstream>
#include <thread>

#include "common/crypto.h"
#include "common/logging.h"
#include "common/socket_util.h"
#include "rendezvous/store.h"
#include "transport/tcp_wire.h"

namespace hvdlite {
namespace {

using namespace tcp_wire;

std::string U32Bytes(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}

// The proofs are false only when libcrypto fails; the handshake then fails closed.
bool ConnectorProof(const std::string& secret, const std::string& nonce_a, int rank,
                    const std::string& prefix, Digest256* out) {
  return HmacSha256(secret, nonce_a + U32Bytes(uint32_t(rank)) + prefix + "conn", out);
}

bool AcceptorProof(const std::string& secret, const std::string& nonce_c, int rank, const std::string& prefix,
                   Digest256* out) {
  return HmacSha256(secret, nonce_c + U32Bytes(uint32_t(rank)) + prefix + "acc", out);
}

std::string NewNonce() {
  std::string nonce(kNonceLen, '\0');
  if (!RandomBytes(&nonce[0], nonce.size())) return "";
  return nonce;
}

// Sends a short handshake message in one go; a fresh socket's buffer always has room.
bool SendAll(int fd, const std::string& bytes) {
  ssize_t n;
  do {
    n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == ssize_t(bytes.size());
}

struct Incoming {
  int fd = -1;
  Deadline deadline;
  std::string nonce;
  char hello[kHelloLen];
  size_t got = 0;
};

enum class Step { kPending, kDrop, kDone };

// The acceptor half of the handshake for one incoming connection, as far as
// its bytes have arrived. kDone: *peer is the proven rank.
Step ReadHello(Incoming* in, int rank, int size, const std::string& prefix, const std::string& secret,
               int* peer_out) {
  ssize_t n;
  do {
    n = ::recv(in->fd, in->hello + in->got, kHelloLen - in->got, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kPending;
  if (n <= 0) return Step::kDrop;
  in->got += size_t(n);
  if (in->got >= 4 && !std::equal(kHandshakeMagic, kHandshakeMagic + 4, in->hello)) {
    HVD_LOG(kWarning, "rank " << rank << ": dropped a connection that is not an hvdlite peer");
    return Step::kDrop;
  }
  if (in->got < kHelloLen) return Step::kPending;
  uint32_t peer = 0;
  for (int i = 0; i < 4; ++i) peer |= uint32_t(uint8_t(in->hello[4 + i])) << (8 * i);
  if (peer == uint32_t(rank) || peer >= uint32_t(size)) {
    HVD_LOG(kWarning, "rank " << rank << ": dropped a connection claiming an unexpected rank " << peer);
    return Step::kDrop;
  }
  Digest256 proof;
  std::copy(in->hello + 8, in->hello + 40, proof.begin());
  Digest256 expected;
  if (!ConnectorProof(secret, in->nonce, int(peer), prefix, &expected)) {
    HVD_LOG(kWarning, "rank " << rank << ": dropped a connection: libcrypto's HMAC-SHA256 failed");
    return Step::kDrop;
  }
  if (!DigestEqual(proof, expected)) {
    HVD_LOG(kWarning, "rank " << rank << ": dropped a connection with a wrong proof of the job secret");
    return Step::kDrop;
  }
  std::string nonce_c(in->hello + 40, kNonceLen);
  Digest256 answer;
  if (!AcceptorProof(secret, nonce_c, rank, prefix, &answer)) return Step::kDrop;
  if (!SendAll(in->fd, std::string(answer.begin(), answer.end()))) return Step::kDrop;
  *peer_out = int(peer);
  return Step::kDone;
}

// Accepts every pending connection and greets it (the acceptor sends first).
void AcceptNew(int listen_fd, std::list<Incoming>* incoming) {
  for (;;) {
    int fd = net::AcceptTcp(listen_fd);
    if (fd < 0) return;
    Incoming in;
    in.fd = fd;
    in.deadline = Deadline::After(kHandshakeTimeoutS);
    in.nonce = NewNonce();
    std::string greeting(kHandshakeMagic, sizeof(kHandshakeMagic));
    if (in.nonce.empty() || !SendAll(fd, greeting + in.nonce)) {
      net::CloseFd(&fd);
      continue;
    }
    incoming->push_back(std::move(in));
  }
}

void Signal(int efd) {
  uint64_t one = 1;
  ssize_t rc = ::write(efd, &one, sizeof(one));
  (void)rc;
}

// Connects to `peer` and runs the connector half of the handshake.
Status ConnectToPeer(Store* store, const std::string& prefix, int rank, int peer, const std::string& secret,
                     const Deadline& deadline, int* fd_out) {
  std::string addr, host;
  int port = 0;
  HVD_RETURN_IF_ERROR(
      store->Get(prefix + "addr/" + std::to_string(peer), deadline.RemainingMs() / 1000.0, &addr));
  if (!net::ParseHostPort(addr, &host, &port)) {
    return Status::InvalidArgument("malformed address '" + addr + "' published by rank " +
                                   std::to_string(peer));
  }
  int fd = -1;
  Status st = net::ConnectTcp(host, port, deadline, &fd);
  char greeting[kGreetingLen];
  if (st.ok()) st = net::ReadExact(fd, greeting, sizeof(greeting), deadline);
  if (st.ok() && !std::equal(kHandshakeMagic, kHandshakeMagic + 4, greeting)) {
    st = Status::Internal("the process listening there is not an hvdlite rank");
  }
  std::string nonce_c = NewNonce();
  if (st.ok() && nonce_c.empty()) st = Status::Internal("no random bytes for the handshake");
  if (st.ok()) {
    Digest256 proof;
    if (!ConnectorProof(secret, std::string(greeting + 4, kNonceLen), rank, prefix, &proof)) {
      st = Status::Internal("libcrypto's HMAC-SHA256 failed");
    } else {
      std::string hello(kHandshakeMagic, 4);
      hello += U32Bytes(uint32_t(rank)) + std::string(proof.begin(), proof.end()) + nonce_c;
      st = net::WriteExact(fd, hello.data(), hello.size(), deadline);
    }
  }
  Digest256 answer, expected;
  if (st.ok()) st = net::ReadExact(fd, answer.data(), answer.size(), deadline);
  if (st.ok() && !AcceptorProof(secret, nonce_c, peer, prefix, &expected)) {
    st = Status::Internal("libcrypto's HMAC-SHA256 failed");
  }
  if (st.ok() && !DigestEqual(answer, expected)) {
    st = Status::Aborted("it did not prove the job secret (another job on that port?)");
  }
  if (!st.ok()) {
    net::CloseFd(&fd);
    return st.WithContext("rank " + std::to_string(rank) + " could not connect to rank " +
                          std::to_string(peer) + " at " + addr);
  }
  *fd_out = fd;
  return Status::OK();
}

}  // namespace

void SetLiveness(int fd, int seconds) {
  const int idle = 1, interval = 1;
  const int count = std::max(1, seconds - idle);
  const unsigned user_timeout_ms = unsigned(std::max(2, seconds)) * 1000u;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

PeerConnector::PeerConnector(Store* store, std::string prefix, int rank, int size, std::string secret,
                             int liveness_s)
    : store_(store),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      secret_(std::move(secret)),
      liveness_s_(liveness_s) {}

PeerConnector::~PeerConnector() { Stop(); }

Status PeerConnector::Start(const std::string& advertise_host) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || stop_fd_ < 0) return Status::Internal("eventfd failed: " + net::ErrnoString(errno));
  int port = 0;
  HVD_RETURN_IF_ERROR(net::ListenTcp(advertise_host, 0, &listen_fd_, &port));
  thread_ = std::thread([this] { AcceptLoop(); });
  return store_->Set(prefix_ + "addr/" + std::to_string(rank_), net::JoinHostPort(advertise_host, port));
}

Status PeerConnector::Connect(int peer, const Deadline& deadline, int* fd) {
  HVD_RETURN_IF_ERROR(ConnectToPeer(store_, prefix_, rank_, peer, secret_, deadline, fd));
  SetLiveness(*fd, liveness_s_);
  return Status::OK();
}

void PeerConnector::TakeAccepted(std::vector<std::pair<int, int>>* out) {
  if (queued_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  queued_.store(0, std::memory_order_relaxed);
  uint64_t drained = 0;
  ssize_t rc = ::read(wake_fd_, &drained, sizeof(drained));  // under mu_: no signal is lost
  (void)rc;
  out->insert(out->end(), accepted_.begin(), accepted_.end());
  accepted_.clear();
}

void PeerConnector::Stop() {
  if (thread_.joinable()) {
    Signal(stop_fd_);
    thread_.join();
  }
  net::CloseFd(&listen_fd_);
  for (auto& a : accepted_) net::CloseFd(&a.second);
  accepted_.clear();
  net::CloseFd(&wake_fd_);
  net::CloseFd(&stop_fd_);
}

// The accept thread: accepts, greets, and finishes handshakes as their bytes
// arrive (poll-based, so a silent stranger costs nothing but its slot until
// its own deadline), until Stop().
void PeerConnector::AcceptLoop() {
  std::list<Incoming> incoming;
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({stop_fd_, POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    int timeout_ms = -1;
    for (const Incoming& in : incoming) {
      pfds.push_back({in.fd, POLLIN, 0});
      const int left = in.deadline.RemainingMs() + 1;
      timeout_ms = timeout_ms < 0 ? left : std::min(timeout_ms, left);
    }
    int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && pfds[0].revents) break;
    size_t i = 2;
    for (auto it = incoming.begin(); it != incoming.end(); ++i) {
      Step step = Step::kPending;
      int peer = -1;
      if (n > 0 && pfds[i].revents) step = ReadHello(&*it, rank_, size_, prefix_, secret_, &peer);
      if (step == Step::kPending && it->deadline.expired()) {
        HVD_LOG(kWarning, "rank " << rank_ << ": dropped a connection that did not finish the "
                                  << "handshake within " << kHandshakeTimeoutS << "s");
        step = Step::kDrop;
      }
      if (step == Step::kDone) {
        std::lock_guard<std::mutex> lock(mu_);
        SetLiveness(it->fd, liveness_s_);
        accepted_.emplace_back(peer, it->fd);
        queued_.store(static_cast<int>(accepted_.size()), std::memory_order_release);
        it->fd = -1;
        Signal(wake_fd_);
      }
      if (step == Step::kDrop) net::CloseFd(&it->fd);
      it = (step == Step::kPending) ? std::next(it) : incoming.erase(it);
    }
    if (n > 0 && pfds[1].revents) AcceptNew(listen_fd_, &incoming);
  }
  for (Incoming& in : incoming) net::CloseFd(&in.fd);
}

}  // namespace hvdlite
