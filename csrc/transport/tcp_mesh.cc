// Mesh setup for the TCP transport: publish, connect down, accept up, with a
// mutual HMAC handshake (wire layout in tcp_wire.h).
#include "transport/tcp_mesh.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "common/sha256.h"
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

Digest256 ConnectorProof(const std::string& secret, const std::string& nonce_a, int rank,
                         const std::string& prefix) {
  return HmacSha256(secret, nonce_a + U32Bytes(uint32_t(rank)) + prefix + "conn");
}

Digest256 AcceptorProof(const std::string& secret, const std::string& nonce_c, int rank,
                        const std::string& prefix) {
  return HmacSha256(secret, nonce_c + U32Bytes(uint32_t(rank)) + prefix + "acc");
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

// Accepts and authenticates every higher rank on a helper thread.
class Acceptor {
 public:
  Acceptor(int listen_fd, int rank, int size, const std::string& prefix, const std::string& secret,
           Deadline deadline)
      : listen_fd_(listen_fd),
        rank_(rank),
        size_(size),
        prefix_(prefix),
        secret_(secret),
        deadline_(deadline),
        fds_(size, -1) {}
  ~Acceptor() { net::CloseFd(&wake_fd_); }

  Status Start() {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status::Internal("eventfd failed: " + net::ErrnoString(errno));
    thread_ = std::thread([this] { status_ = Run(); });
    return Status::OK();
  }
  void Cancel() {
    uint64_t one = 1;
    ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
    (void)rc;
  }
  // Joins the thread; on success moves the accepted sockets into *fds.
  Status Finish(std::vector<int>* fds) {
    if (thread_.joinable()) thread_.join();
    for (int p = 0; p < size_; ++p) {
      if (fds_[p] < 0) continue;
      if (status_.ok()) {
        (*fds)[p] = fds_[p];
      } else {
        net::CloseFd(&fds_[p]);
      }
    }
    return status_;
  }

 private:
  enum class Step { kPending, kDrop, kDone };
  Status Run();
  void AcceptAll();
  Step OnReadable(Incoming* in);
  Status MissingRanksError() const;

  int listen_fd_;
  int rank_, size_;
  std::string prefix_, secret_;
  Deadline deadline_;
  std::vector<int> fds_;
  std::list<Incoming> incoming_;
  int wake_fd_ = -1;
  std::thread thread_;
  Status status_;
};

Status Acceptor::Run() {
  int missing = size_ - 1 - rank_;
  std::vector<pollfd> pfds;
  while (missing > 0) {
    if (deadline_.expired()) break;
    pfds.clear();
    pfds.push_back({wake_fd_, POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    int timeout_ms = deadline_.RemainingMs();
    for (const Incoming& in : incoming_) {
      pfds.push_back({in.fd, POLLIN, 0});
      timeout_ms = std::min(timeout_ms, in.deadline.RemainingMs() + 1);
    }
    int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) return Status::Internal("poll failed: " + net::ErrnoString(errno));
    if (pfds[0].revents) return Status::Aborted("mesh setup cancelled");
    size_t i = 2;
    for (auto it = incoming_.begin(); it != incoming_.end(); ++i) {
      Step step = Step::kPending;
      if (n > 0 && pfds[i].revents) step = OnReadable(&*it);
      if (step == Step::kPending && it->deadline.expired()) {
        HVD_LOG(kWarning, "rank " << rank_ << ": dropped a connection that did not finish the "
                                  << "handshake within " << kHandshakeTimeoutS << "s");
        step = Step::kDrop;
      }
      if (step == Step::kDone) --missing;
      if (step == Step::kDrop) net::CloseFd(&it->fd);
      it = (step == Step::kPending) ? std::next(it) : incoming_.erase(it);
    }
    if (n > 0 && pfds[1].revents) AcceptAll();
  }
  for (Incoming& in : incoming_) net::CloseFd(&in.fd);
  incoming_.clear();
  return missing == 0 ? Status::OK() : MissingRanksError();
}

Status Acceptor::MissingRanksError() const {
  std::ostringstream os;
  os << "rank " << rank_ << " timed out waiting for ranks [";
  bool first = true;
  for (int p = rank_ + 1; p < size_; ++p) {
    if (fds_[p] >= 0) continue;
    os << (first ? "" : ", ") << p;
    first = false;
  }
  os << "] to connect (did they start? is this host reachable from theirs?)";
  return Status::Timeout(os.str());
}

void Acceptor::AcceptAll() {
  for (;;) {
    int fd = net::AcceptTcp(listen_fd_);
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
    incoming_.push_back(std::move(in));
  }
}

Acceptor::Step Acceptor::OnReadable(Incoming* in) {
  ssize_t n;
  do {
    n = ::recv(in->fd, in->hello + in->got, kHelloLen - in->got, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kPending;
  if (n <= 0) return Step::kDrop;
  in->got += size_t(n);
  if (in->got >= 4 && !std::equal(kHandshakeMagic, kHandshakeMagic + 4, in->hello)) {
    HVD_LOG(kWarning, "rank " << rank_ << ": dropped a connection that is not an hvdlite peer");
    return Step::kDrop;
  }
  if (in->got < kHelloLen) return Step::kPending;
  uint32_t peer = 0;
  for (int i = 0; i < 4; ++i) peer |= uint32_t(uint8_t(in->hello[4 + i])) << (8 * i);
  if (peer <= uint32_t(rank_) || peer >= uint32_t(size_) || fds_[peer] >= 0) {
    HVD_LOG(kWarning, "rank " << rank_ << ": dropped a connection claiming an unexpected rank " << peer);
    return Step::kDrop;
  }
  Digest256 proof;
  std::copy(in->hello + 8, in->hello + 40, proof.begin());
  if (!DigestEqual(proof, ConnectorProof(secret_, in->nonce, int(peer), prefix_))) {
    HVD_LOG(kWarning, "rank " << rank_ << ": dropped a connection with a wrong proof of the job secret");
    return Step::kDrop;
  }
  std::string nonce_c(in->hello + 40, kNonceLen);
  Digest256 answer = AcceptorProof(secret_, nonce_c, rank_, prefix_);
  if (!SendAll(in->fd, std::string(answer.begin(), answer.end()))) return Step::kDrop;
  fds_[peer] = in->fd;
  in->fd = -1;
  return Step::kDone;
}

// Connects to lower rank `peer` and runs the connector half of the handshake.
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
    Digest256 proof = ConnectorProof(secret, std::string(greeting + 4, kNonceLen), rank, prefix);
    std::string hello(kHandshakeMagic, 4);
    hello += U32Bytes(uint32_t(rank)) + std::string(proof.begin(), proof.end()) + nonce_c;
    st = net::WriteExact(fd, hello.data(), hello.size(), deadline);
  }
  Digest256 answer;
  if (st.ok()) st = net::ReadExact(fd, answer.data(), answer.size(), deadline);
  if (st.ok() && !DigestEqual(answer, AcceptorProof(secret, nonce_c, peer, prefix))) {
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

Status BuildTcpMesh(Store* store, const std::string& prefix, int rank, int size,
                    const std::string& advertise_host, const std::string& secret, double connect_timeout_s,
                    std::vector<int>* fds) {
  fds->assign(size, -1);
  if (size <= 1) return Status::OK();
  Deadline deadline = Deadline::After(connect_timeout_s);
  int listen_fd = -1;
  std::unique_ptr<Acceptor> acceptor;
  Status st;
  {  // every rank publishes a real address, even the highest (which accepts nobody)
    int port = 0;
    HVD_RETURN_IF_ERROR(net::ListenTcp(advertise_host, 0, &listen_fd, &port));
    acceptor.reset(new Acceptor(listen_fd, rank, size, prefix, secret, deadline));
    st = acceptor->Start();
    if (st.ok()) {
      st = store->Set(prefix + "addr/" + std::to_string(rank), net::JoinHostPort(advertise_host, port));
    }
  }
  for (int peer = 0; peer < rank && st.ok(); ++peer) {
    st = ConnectToPeer(store, prefix, rank, peer, secret, deadline, &(*fds)[peer]);
  }
  if (acceptor != nullptr) {
    if (!st.ok()) acceptor->Cancel();
    Status accept_st = acceptor->Finish(fds);
    if (st.ok()) st = accept_st;
  }
  net::CloseFd(&listen_fd);
  if (!st.ok()) {
    for (int& fd : *fds) net::CloseFd(&fd);
  }
  return st;
}

}  // namespace hvdlite
