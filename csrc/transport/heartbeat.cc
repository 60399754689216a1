// Heartbeat (heartbeat.h): the thread that beats to the ring neighbours and
// watches theirs.
#include "transport/heartbeat.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "common/socket_util.h"

namespace hvdlite {
namespace {

// How long one connect try may wait (for the neighbour's address in the store,
// the TCP connect and the handshake): Stop() waits at most this long.
constexpr double kConnectSliceS = 0.1;
// Pause between connect tries, so a refused connection does not spin.
constexpr int kConnectRetryMs = 20;

void Signal(int efd) {
  uint64_t one = 1;
  ssize_t rc = ::write(efd, &one, sizeof(one));
  (void)rc;
}

void CloseSocket(int* fd) {
  if (*fd < 0) return;
  ::shutdown(*fd, SHUT_RDWR);  // also when a forked child shares the fd
  net::CloseFd(fd);
}

}  // namespace

Heartbeat::Heartbeat(int rank, int size, double bound_s)
    : rank_(rank), size_(size), bound_s_(std::max(1.0, bound_s)) {}

Heartbeat::~Heartbeat() { Stop(); }

Status Heartbeat::Start(Store* store, const std::string& prefix, const std::string& advertise_host,
                        const std::string& secret, int liveness_s, const std::vector<int>& neighbours,
                        const Deadline& connect_deadline) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || stop_fd_ < 0) return Status::Internal("eventfd failed: " + net::ErrnoString(errno));
  connector_.reset(new PeerConnector(store, prefix + "beat/", rank_, size_, secret, liveness_s));
  HVD_RETURN_IF_ERROR(connector_->Start(advertise_host));
  for (int q : neighbours) {
    if (q == rank_ || std::find(neighbours_.begin(), neighbours_.end(), q) != neighbours_.end()) continue;
    neighbours_.push_back(q);
    (q > rank_ ? to_connect_ : to_accept_).push_back(q);
  }
  connect_deadline_ = connect_deadline;
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void Heartbeat::Stop() {
  if (thread_.joinable()) {
    Signal(stop_fd_);
    thread_.join();
  }
  for (Watched& w : watched_) CloseSocket(&w.fd);
  watched_.clear();
  connector_.reset();
  net::CloseFd(&wake_fd_);
  net::CloseFd(&stop_fd_);
}

void Heartbeat::ConnectNext() {
  const int q = to_connect_.front();
  int fd = -1;
  Status st = connector_->Connect(q, Deadline::After(kConnectSliceS), &fd);
  if (st.ok()) {
    Add(q, fd);
    to_connect_.erase(to_connect_.begin());
  } else if (connect_deadline_.expired()) {
    HVD_LOG(kWarning, "rank " << rank_ << " has no heartbeat connection to rank " << q << " (" << st.message()
                              << "): if that rank freezes, only the transfer timeout finds it");
    to_connect_.erase(to_connect_.begin());
  }
}

void Heartbeat::Adopt() {
  std::vector<std::pair<int, int>> got;
  connector_->TakeAccepted(&got);
  for (auto& a : got) {
    auto it = std::find(to_accept_.begin(), to_accept_.end(), a.first);
    if (it == to_accept_.end()) {  // not a neighbour below this rank, or a second socket: not ours to watch
      CloseSocket(&a.second);
      continue;
    }
    to_accept_.erase(it);
    Add(a.first, a.second);
  }
}

void Heartbeat::Add(int peer, int fd) {
  const char beat = 'b';
  ssize_t n = ::send(fd, &beat, 1, MSG_DONTWAIT | MSG_NOSIGNAL);  // a fresh socket has room
  (void)n;
  watched_.push_back(Watched{peer, fd, false, Clock::now()});
}

Status Heartbeat::AwaitFirstBeats(const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(heard_mu_);
  for (;;) {
    if (heard_.size() >= neighbours_.size()) return Status::OK();
    if (deadline.expired()) break;
    heard_cv_.wait_for(lock, std::chrono::milliseconds(std::max(1, deadline.RemainingMs(100))));
  }
  std::string who;
  for (int q : neighbours_) {
    if (std::find(heard_.begin(), heard_.end(), q) == heard_.end())
      who += (who.empty() ? "" : ", ") + std::to_string(q);
  }
  return Status::Timeout(
      "rank " + std::to_string(rank_) + " heard no heartbeat from ranks [" + who +
      "] during init (are they stopped, or is their heartbeat port unreachable from this host?)");
}

bool Heartbeat::Drain(Watched* w, Clock::time_point now) {
  char buf[256];
  for (;;) {
    ssize_t n = ::recv(w->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      if (!w->heard_once) {
        std::lock_guard<std::mutex> lock(heard_mu_);
        heard_.push_back(w->peer);
        heard_cv_.notify_all();
      }
      w->heard_once = true;
      w->heard = now;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

void Heartbeat::BeatAndWatch(Clock::time_point now) {
  const char beat = 'b';
  for (Watched& w : watched_) {
    // A full buffer (a frozen peer stops reading) just skips a beat: the peer is being judged anyway.
    ssize_t n = ::send(w.fd, &beat, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
  }
  if (frozen_.load(std::memory_order_relaxed) >= 0) return;
  const auto bound = std::chrono::duration<double>(bound_s_);
  for (const Watched& w : watched_) {
    if (!w.heard_once || now - w.heard <= bound) continue;
    HVD_LOG(kDebug, "rank " << rank_ << ": no heartbeat from rank " << w.peer << " for " << bound_s_ << " s");
    frozen_.store(w.peer, std::memory_order_release);
    Signal(wake_fd_);
    return;
  }
}

// Beats every bound / kBeatsPerBound; between beats sleeps in poll on the
// neighbours' sockets, the connector's doorbell and the stop eventfd.
void Heartbeat::Loop() {
  const auto period = std::chrono::duration<double>(bound_s_ / kBeatsPerBound);
  const auto stalled = std::chrono::duration<double>(bound_s_ / 2);
  Clock::time_point last_turn = Clock::now(), next_beat = last_turn;
  std::vector<pollfd> pfds;
  for (;;) {
    if (!to_connect_.empty()) ConnectNext();
    if (connector_ != nullptr && to_connect_.empty() && to_accept_.empty()) connector_.reset();
    pfds.clear();
    pfds.push_back(pollfd{stop_fd_, POLLIN, 0});
    pfds.push_back(pollfd{connector_ != nullptr ? connector_->wake_fd() : -1, POLLIN, 0});
    for (const Watched& w : watched_) pfds.push_back(pollfd{w.fd, POLLIN, 0});
    const auto until_beat = std::chrono::duration<double>(next_beat - Clock::now()).count();
    int wait_ms = std::max(0, int(std::ceil(until_beat * 1000.0)));
    if (!to_connect_.empty()) wait_ms = std::min(wait_ms, kConnectRetryMs);
    const int n = ::poll(pfds.data(), pfds.size(), wait_ms);
    if (n < 0 && errno != EINTR) {
      HVD_LOG(kWarning, "heartbeat poll failed: " << net::ErrnoString(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(kConnectRetryMs));
    }
    if (n > 0 && pfds[0].revents != 0) return;
    const Clock::time_point now = Clock::now();
    if (now - last_turn > stalled) {  // this thread was not running: give the neighbours a fresh bound
      for (Watched& w : watched_) w.heard = now;
    }
    last_turn = now;
    size_t kept = 0;
    for (size_t i = 0; i < watched_.size(); ++i) {
      const bool readable = n > 0 && i + 2 < pfds.size() && pfds[i + 2].revents != 0;
      if (readable && !Drain(&watched_[i], now)) {
        CloseSocket(&watched_[i].fd);  // it exited or its host failed: the transport reports that
        continue;
      }
      watched_[kept++] = watched_[i];
    }
    watched_.resize(kept);
    if (n > 0 && pfds[1].revents != 0 && connector_ != nullptr) Adopt();
    if (now >= next_beat) {
      BeatAndWatch(now);
      next_beat = now + std::chrono::duration_cast<Clock::duration>(period);
    }
  }
}

}  // namespace hvdlite
