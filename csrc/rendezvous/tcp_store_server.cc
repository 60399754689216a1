// TcpStoreServer: one poll() thread serving every client (protocol in tcp_store.h).
//
// Each client is a small state machine (authenticating -> admitted) with its
// own input and output buffers, so a slow, silent or hostile client never
// blocks the others: it is dropped on the first protocol violation or when it
// fails to authenticate within kAuthTimeoutS.
//
// There is no cap on the number of clients (one per rank): the only limit is
// the process's open-file limit, checked at start-up for the expected number of
// clients (EnsureOpenFiles). Should accept() still run out of descriptors, the
// server logs an error naming the limit and the fix, and stops watching the
// listener for kAcceptBackoffMs (no busy loop) while it keeps serving the
// clients it has; the refused ones retry their connect until their timeout.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "common/fd_limit.h"
#include "common/logging.h"
#include "common/socket_util.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store.h"

namespace hvdlite {
namespace {

using namespace store_wire;

constexpr int kAcceptBackoffMs = 100;             // after EMFILE/ENFILE: how long the listener rests
constexpr size_t kMaxPendingOutput = 256u << 20;  // a client that never reads its replies

struct Client {
  int fd = -1;
  bool admitted = false;
  Deadline auth_deadline;
  Digest256 expected_proof{};
  std::string in;
  std::string out;
  size_t out_sent = 0;
};

class TcpStoreServerImpl : public TcpStoreServer {
 public:
  TcpStoreServerImpl(int listen_fd, int port, int wake_fd, const std::string& secret)
      : listen_fd_(listen_fd), port_(port), wake_fd_(wake_fd), secret_(secret) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~TcpStoreServerImpl() override { Stop(); }

  int port() const override { return port_; }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_.store(true);
    uint64_t one = 1;
    ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
    (void)rc;
    if (thread_.joinable()) thread_.join();
    for (Client& c : clients_) net::CloseFd(&c.fd);
    clients_.clear();
    net::CloseFd(&listen_fd_);
    net::CloseFd(&wake_fd_);
  }

 private:
  void Loop();
  void AcceptAll();
  void OnDescriptorsExhausted(int err);
  int NextTimeoutMs() const;
  // Each returns false when the client must be dropped.
  bool OnReadable(Client* c);
  bool OnWritable(Client* c);
  bool Authenticate(Client* c);
  bool ProcessRequests(Client* c);
  void Handle(uint8_t op, const std::string& key, const std::string& val, std::string* reply);

  int listen_fd_;
  int port_;
  int wake_fd_;
  std::string secret_;
  std::list<Client> clients_;
  std::map<std::string, std::string> data_;
  Deadline accept_pause_ = Deadline::After(0);  // the listener is not watched until it expires (EMFILE)
  bool told_fd_exhausted_ = false;              // the EMFILE error is logged once per server
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::thread thread_;
};

void TcpStoreServerImpl::Loop() {
  std::vector<pollfd> fds;
  std::vector<Client*> owners;
  while (!stop_.load()) {
    fds.clear();
    owners.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    // While accepting rests (EMFILE), the listener is polled for nothing.
    fds.push_back({listen_fd_, short(accept_pause_.expired() ? POLLIN : 0), 0});
    for (Client& c : clients_) {
      short ev = POLLIN;
      if (c.out_sent < c.out.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      owners.push_back(&c);
    }
    int n = ::poll(fds.data(), fds.size(), NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      HVD_LOG(kError, "store server: poll failed: " << net::ErrnoString(errno));
      return;
    }
    if (stop_.load()) return;
    if (n > 0 && (fds[1].revents & POLLIN)) AcceptAll();
    for (size_t i = 0; i < owners.size(); ++i) {
      Client* c = owners[i];
      short re = fds[i + 2].revents;
      bool keep = true;
      if (re & (POLLIN | POLLHUP | POLLERR)) keep = OnReadable(c);
      if (keep && (re & POLLOUT)) keep = OnWritable(c);
      if (keep && !c->admitted && c->auth_deadline.expired()) {
        HVD_LOG(kDebug, "store server: dropping a client that did not authenticate in time");
        keep = false;
      }
      if (!keep) net::CloseFd(&c->fd);
    }
    clients_.remove_if([](const Client& c) { return c.fd < 0; });
  }
}

void TcpStoreServerImpl::OnDescriptorsExhausted(int err) {
  accept_pause_ = Deadline::After(kAcceptBackoffMs / 1000.0);
  if (told_fd_exhausted_) return;
  told_fd_exhausted_ = true;
  HVD_LOG(kError, OpenFilesExhausted(err, "the rendezvous store server (" + std::to_string(clients_.size()) +
                                              " clients connected)"));
}

int TcpStoreServerImpl::NextTimeoutMs() const {
  int ms = 1000;
  if (!accept_pause_.expired()) ms = std::min(ms, accept_pause_.RemainingMs() + 1);
  for (const Client& c : clients_) {
    if (!c.admitted) ms = std::min(ms, c.auth_deadline.RemainingMs() + 1);
  }
  return ms;
}

void TcpStoreServerImpl::AcceptAll() {
  for (;;) {
    int fd = net::AcceptTcp(listen_fd_);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) OnDescriptorsExhausted(errno);
      return;
    }
    Client c;
    c.fd = fd;
    c.auth_deadline = Deadline::After(kAuthTimeoutS);
    uint8_t nonce[kNonceLen];
    std::string challenge;
    if (RandomBytes(nonce, sizeof(nonce)))
      challenge.assign(reinterpret_cast<const char*>(nonce), sizeof(nonce));
    if (challenge.empty() || !HmacSha256(secret_, challenge + kProofContext, &c.expected_proof)) {
      HVD_LOG(kWarning, "store server: libcrypto failed (random bytes or HMAC); closed a new connection");
      net::CloseFd(&fd);
      continue;
    }
    c.out.assign(kServerMagic, sizeof(kServerMagic));
    c.out += challenge;
    clients_.push_back(std::move(c));
    OnWritable(&clients_.back());  // usually sends the whole challenge at once
  }
}

bool TcpStoreServerImpl::OnReadable(Client* c) {
  char buf[64 * 1024];
  for (;;) {
    // Before admission read only what the proof needs (+1 to notice excess).
    size_t want = c->admitted ? sizeof(buf) : kProofLen + 1 - c->in.size();
    ssize_t n = ::recv(c->fd, buf, want, 0);
    if (n > 0) {
      c->in.append(buf, size_t(n));
      if (!c->admitted) {
        if (c->in.size() > kProofLen) return false;  // talks before being admitted
        if (c->in.size() == kProofLen && !Authenticate(c)) return false;
        continue;
      }
      if (!ProcessRequests(c)) return false;
      if (size_t(n) < want) return true;
      continue;
    }
    if (n == 0) return false;  // EOF
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

bool TcpStoreServerImpl::OnWritable(Client* c) {
  while (c->out_sent < c->out.size()) {
    ssize_t n = ::send(c->fd, c->out.data() + c->out_sent, c->out.size() - c->out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_sent += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
  c->out.clear();
  c->out_sent = 0;
  return true;
}

bool TcpStoreServerImpl::Authenticate(Client* c) {
  Digest256 proof;
  std::copy(c->in.begin(), c->in.end(), proof.begin());
  c->in.clear();
  if (!DigestEqual(proof, c->expected_proof)) {
    HVD_LOG(kWarning, "store server: rejected a client with a wrong proof of the job secret");
    return false;
  }
  c->admitted = true;
  c->out.push_back(char(kAdmitted));
  return OnWritable(c);
}

// Parses every complete request frame in c->in; false on a protocol violation.
bool TcpStoreServerImpl::ProcessRequests(Client* c) {
  size_t pos = 0;
  const std::string& in = c->in;
  std::string key, val;
  for (;;) {
    size_t avail = in.size() - pos;
    if (avail < 5) break;
    uint8_t op = uint8_t(in[pos]);
    if (op != kSet && op != kGet && op != kAdd) return false;
    uint32_t klen = GetU32(&in[pos + 1]);
    if (klen > kMaxLen) return false;
    if (avail < 5 + size_t(klen) + 4) break;
    uint32_t vlen = GetU32(&in[pos + 5 + klen]);
    if (vlen > kMaxLen) return false;
    size_t total = 5 + size_t(klen) + 4 + size_t(vlen);
    if (avail < total) break;
    key.assign(in, pos + 5, klen);
    val.assign(in, pos + 9 + klen, vlen);
    Handle(op, key, val, &c->out);
    pos += total;
  }
  c->in.erase(0, pos);
  if (c->out.size() > kMaxPendingOutput) return false;
  return OnWritable(c);
}

void TcpStoreServerImpl::Handle(uint8_t op, const std::string& key, const std::string& val,
                                std::string* reply) {
  auto put_reply = [reply](uint8_t status, const std::string& payload) {
    reply->push_back(char(status));
    PutU32(reply, uint32_t(payload.size()));
    reply->append(payload);
  };
  if (op == kSet) {
    data_[key] = val;
    put_reply(kOk, "");
  } else if (op == kGet) {
    auto it = data_.find(key);
    if (it == data_.end()) {
      put_reply(kNotFound, "");
    } else {
      put_reply(kOk, it->second);
    }
  } else {  // kAdd
    int64_t current = 0;
    auto it = data_.find(key);
    if (val.size() != 8) {
      put_reply(kBadRequest, "malformed Add request");
    } else if (it != data_.end() && !ParseStoreCounter(it->second, &current)) {
      put_reply(kBadRequest, "store key '" + key + "' holds a non-integer value; Add() needs a counter");
    } else {
      current += GetI64(val.data());
      data_[key] = std::to_string(current);
      std::string payload;
      PutI64(&payload, current);
      put_reply(kOk, payload);
    }
  }
}

}  // namespace

Status StartTcpStoreServer(const std::string& host, int port, const std::string& secret,
                           std::unique_ptr<TcpStoreServer>* out, int expected_clients) {
  if (expected_clients > 0) {
    HVD_RETURN_IF_ERROR(
        EnsureOpenFiles(static_cast<uint64_t>(expected_clients),
                        "the rendezvous store server for " + std::to_string(expected_clients) + " ranks"));
  }
  int listen_fd = -1, bound_port = -1;
  HVD_RETURN_IF_ERROR(net::ListenTcp(host, port, &listen_fd, &bound_port));
  int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    net::CloseFd(&listen_fd);
    return Status::Internal("eventfd failed: " + net::ErrnoString(errno));
  }
  out->reset(new TcpStoreServerImpl(listen_fd, bound_port, wake_fd, secret));
  return Status::OK();
}

}  // namespace hvdlite
