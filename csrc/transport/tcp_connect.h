// PeerConnector: opens the TCP transport's connections on demand (private to
// csrc/transport).
//
// At start it listens on advertise_host:0, publishes "<prefix>addr/<rank>" in
// the store and runs an accept thread for the transport's whole life. Any peer
// may connect at any time; each connection is authenticated both ways with an
// HMAC-SHA256 challenge over the raw job secret (wire layout in tcp_wire.h),
// and a stranger (garbage, HTTP, a wrong proof, silence for
// kHandshakeTimeoutS) is dropped without disturbing anything. Authenticated
// sockets wait in a queue until the transport's thread takes them
// (TakeAccepted); wake_fd() becomes readable whenever the queue is non-empty.
//
// Threading: Connect / TakeAccepted / wake_fd are called by the transport's
// one thread; the accept thread only touches the queue (under a mutex) and its
// own state. Blocking: Connect is bounded by its deadline (the store lookup of
// the peer's address included). Ownership: sockets handed out belong to the
// caller; Stop() closes the listener and every socket still queued.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"

namespace hvdlite {

class Store;

class PeerConnector {
 public:
  // `store` must outlive this object (the runtime keeps its store client for
  // the job's life; tests use a static store).
  // liveness_s: SetLiveness's bound on every socket it connects or accepts.
  PeerConnector(Store* store, std::string prefix, int rank, int size, std::string secret, int liveness_s);
  ~PeerConnector();
  PeerConnector(const PeerConnector&) = delete;
  PeerConnector& operator=(const PeerConnector&) = delete;

  // Listens, publishes this rank's address and starts the accept thread.
  Status Start(const std::string& advertise_host);
  // Connects to `peer` and runs the connector half of the handshake. On
  // success *fd is a connected, authenticated, nonblocking TCP_NODELAY socket
  // with keepalive set (SetLiveness). Waits for the peer's address in the store
  // until `deadline`.
  Status Connect(int peer, const Deadline& deadline, int* fd);
  // Moves every authenticated incoming socket (peer rank, fd) into *out and
  // clears wake_fd(). Never blocks; with nothing queued it costs one atomic
  // load (it runs on every transport wait: no lock, no syscall then).
  void TakeAccepted(std::vector<std::pair<int, int>>* out);
  int wake_fd() const { return wake_fd_; }
  // Stops the accept thread, closes the listener and the sockets never taken.
  void Stop();

 private:
  void AcceptLoop();

  Store* store_;
  std::string prefix_;
  int rank_, size_;
  std::string secret_;
  int liveness_s_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: readable while accepted_ is non-empty
  int stop_fd_ = -1;  // eventfd: tells the accept thread to stop
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::pair<int, int>> accepted_;  // guarded by mu_
  std::atomic<int> queued_{0};                 // accepted_.size(), readable without mu_
};

// Keepalive probing on a connected socket, so that a peer whose host goes
// silent (power loss, link down: no FIN ever comes) fails the socket within
// about `seconds` (at least 2) whether or not data is in flight: TCP keepalive
// probes an idle connection once a second and TCP_USER_TIMEOUT bounds
// unacknowledged data. The kernel answers the probes, so a peer that computes
// for hours without touching the transport stays alive.
void SetLiveness(int fd, int seconds);

}  // namespace hvdlite
