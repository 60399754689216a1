// TcpStoreClient: the Store that talks to a TcpStoreServer (protocol in tcp_store.h).
//
// One request/reply at a time under a mutex, so a client can be shared by
// threads. Get() polls the server with a short backoff (the mutex is released
// while it sleeps, so another thread may Set() the awaited key meanwhile).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "common/crypto.h"
#include "common/socket_util.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store.h"

namespace hvdlite {
namespace {

using namespace store_wire;

class TcpStoreClient : public Store {
 public:
  TcpStoreClient(int fd, std::string addr, double io_timeout_s)
      : fd_(fd), addr_(std::move(addr)), io_timeout_s_(io_timeout_s) {}
  ~TcpStoreClient() override { net::CloseFd(&fd_); }

  Status Set(const std::string& key, const std::string& value) override {
    uint8_t status;
    std::string payload;
    HVD_RETURN_IF_ERROR(Call(kSet, key, value, &status, &payload));
    return ReplyStatus(status, payload, key);
  }

  Status Get(const std::string& key, double timeout_s, std::string* value) override {
    Deadline deadline = Deadline::After(timeout_s);
    int backoff_ms = 1;
    for (;;) {
      uint8_t status;
      HVD_RETURN_IF_ERROR(Call(kGet, key, "", &status, value));
      if (status != kNotFound) return ReplyStatus(status, *value, key);
      int left = deadline.RemainingMs();
      if (left <= 0) return StoreGetTimeout(key, timeout_s);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, left)));
      backoff_ms = std::min(backoff_ms * 2, 50);
    }
  }

  Status Add(const std::string& key, int64_t delta, int64_t* result) override {
    std::string arg, payload;
    PutI64(&arg, delta);
    uint8_t status;
    HVD_RETURN_IF_ERROR(Call(kAdd, key, arg, &status, &payload));
    HVD_RETURN_IF_ERROR(ReplyStatus(status, payload, key));
    if (payload.size() != 8) return Broken(Status::Internal("malformed Add reply"));
    if (result != nullptr) *result = GetI64(payload.data());
    return Status::OK();
  }

 private:
  Status Call(uint8_t op, const std::string& key, const std::string& val, uint8_t* status,
              std::string* payload);
  Status Broken(const Status& st) {
    if (broken_.ok()) broken_ = st.WithContext("rendezvous store at " + addr_);
    net::CloseFd(&fd_);
    return broken_;
  }
  static Status ReplyStatus(uint8_t status, const std::string& payload, const std::string& key) {
    if (status == kOk) return Status::OK();
    if (status == kBadRequest) return Status::InvalidArgument(payload);
    return Status::Internal("unexpected store reply " + std::to_string(status) + " for key '" + key + "'");
  }

  std::mutex mu_;
  int fd_;
  std::string addr_;
  double io_timeout_s_;
  Status broken_;
  std::string request_;
};

Status TcpStoreClient::Call(uint8_t op, const std::string& key, const std::string& val, uint8_t* status,
                            std::string* payload) {
  if (key.size() > kMaxLen || val.size() > kMaxLen) {
    return Status::InvalidArgument("store key or value larger than 64 MiB");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  Deadline deadline = Deadline::After(io_timeout_s_);
  request_.clear();
  request_.push_back(char(op));
  PutU32(&request_, uint32_t(key.size()));
  request_ += key;
  PutU32(&request_, uint32_t(val.size()));
  request_ += val;
  Status st = net::WriteExact(fd_, request_.data(), request_.size(), deadline);
  if (!st.ok()) return Broken(st);
  char header[5];
  st = net::ReadExact(fd_, header, sizeof(header), deadline);
  if (!st.ok()) return Broken(st);
  uint32_t len = GetU32(header + 1);
  if (len > kMaxLen) return Broken(Status::Internal("oversized reply"));
  *status = uint8_t(header[0]);
  payload->resize(len);
  if (len > 0) {
    st = net::ReadExact(fd_, &(*payload)[0], len, deadline);
    if (!st.ok()) return Broken(st);
  }
  return Status::OK();
}

// Reads the challenge, answers it and waits for admission.
Status Authenticate(int fd, const std::string& secret, const Deadline& deadline) {
  char challenge[sizeof(kServerMagic) + kNonceLen];
  HVD_RETURN_IF_ERROR(net::ReadExact(fd, challenge, sizeof(challenge), deadline));
  if (!std::equal(kServerMagic, kServerMagic + sizeof(kServerMagic), challenge)) {
    return Status::InvalidArgument("the peer is not an hvdlite rendezvous store");
  }
  std::string nonce(challenge + sizeof(kServerMagic), kNonceLen);
  Digest256 proof;
  if (!HmacSha256(secret, nonce + kProofContext, &proof)) {
    return Status::Internal("libcrypto's HMAC-SHA256 failed: cannot prove the job secret to the store");
  }
  HVD_RETURN_IF_ERROR(net::WriteExact(fd, proof.data(), proof.size(), deadline));
  char admitted = 0;
  Status st = net::ReadExact(fd, &admitted, 1, deadline);
  if (st.code() == StatusCode::kAborted || (st.ok() && uint8_t(admitted) != kAdmitted)) {
    return Status::InvalidArgument(
        "the store rejected this process's proof of the job secret "
        "(was it started with a different secret / job?)");
  }
  return st;
}

}  // namespace

Status ConnectTcpStore(const std::string& addr, const std::string& secret, double timeout_s,
                       std::unique_ptr<Store>* out) {
  std::string host;
  int port = 0;
  if (!net::ParseHostPort(addr, &host, &port)) {
    return Status::InvalidArgument("malformed rendezvous store address '" + addr + "' (want host:port)");
  }
  Deadline deadline = Deadline::After(timeout_s);
  int fd = -1;
  Status st = net::ConnectTcp(host, port, deadline, &fd);
  if (st.ok()) st = Authenticate(fd, secret, deadline);
  if (!st.ok()) {
    net::CloseFd(&fd);
    return st.WithContext("cannot join the rendezvous store at " + addr);
  }
  out->reset(new TcpStoreClient(fd, addr, std::max(timeout_s, 1.0)));
  return Status::OK();
}

}  // namespace hvdlite
