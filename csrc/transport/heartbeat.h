// Heartbeat: finds a frozen neighbour (private to csrc/transport).
//
// A rank whose process stops (SIGSTOP, a debugger, a driver call that hangs
// every thread) keeps its sockets open, and its kernel keeps acknowledging
// data and answering TCP keepalive probes: neither a closed socket nor
// SetLiveness reveals it, and shared memory just goes quiet. So every rank
// runs one heartbeat thread that sends a byte to each of its ring neighbours
// (rank +- 1) every kBeatsPerBound-th of the bound, over connections of its
// own (a second PeerConnector under "<prefix>beat/", authenticated like the
// transport's), and watches what they send: a neighbour from which nothing
// arrived for `bound_s` is frozen. Each rank watches at most two peers and is
// watched by as many: O(1) per rank, and a ring without one member is still a
// connected path, so the failure reaches every survivor.
//
// The thread owns its sockets; it never touches the transport's sockets or the
// Python GIL, so a rank that computes in Python for hours still beats, and an
// idle rank wakes kBeatsPerBound times per bound. It reports through frozen()
// and makes wake_fd() readable once; the transport's thread polls wake_fd() in
// its waits and turns the finding into its failure (which then spreads as any
// failure does: ABORT frames, Runtime::Break).
//
// A neighbour is watched from the first byte it sends (so a rank whose own
// init is still waiting for a late neighbour is never blamed for it), until its
// heartbeat socket closes or fails: then it exited (its transport's sockets
// report that; a departed rank's close is no error) or its host went silent
// (SetLiveness fails the transport's sockets too). Each side beats as soon as
// a connection is up, and init waits for every neighbour's first beat
// (AwaitFirstBeats), so a rank that freezes right after init is watched. When
// this thread itself was not scheduled for half the bound (this process was
// stopped and resumed, or its host stalled), it restarts its clocks rather
// than blame its neighbours.
//
// Threading: Start, AwaitFirstBeats, frozen, wake_fd and Stop are called by
// the transport's one thread; after Start the heartbeat thread alone owns the
// connector and the sockets (it connects to the neighbours above this rank
// itself, in short slices so that Stop never waits long). Blocking: Start only
// listens and publishes; AwaitFirstBeats is bounded by its deadline; Stop
// joins the thread, which wakes at once.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "transport/tcp_connect.h"

namespace hvdlite {

class Store;

class Heartbeat {
 public:
  static constexpr int kBeatsPerBound = 8;

  // bound_s: how long a neighbour may send nothing (at least 1 s).
  Heartbeat(int rank, int size, double bound_s);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Listens and publishes this rank's heartbeat address, then starts the
  // thread, which connects to the `neighbours` above this rank (each lower one
  // connects here, like the transport's eager peers) until `connect_deadline`
  // (a neighbour not reached by then is not watched, with a warning). Call
  // before the transport connects its own eager peers, so that a neighbour
  // that has this rank's transport address also finds its heartbeat's.
  // `liveness_s` goes to SetLiveness on the heartbeat sockets. `store` must
  // outlive this object.
  Status Start(Store* store, const std::string& prefix, const std::string& advertise_host,
               const std::string& secret, int liveness_s, const std::vector<int>& neighbours,
               const Deadline& connect_deadline);
  // Returns once every neighbour's first beat arrived; Timeout naming those
  // still silent at `deadline`.
  Status AwaitFirstBeats(const Deadline& deadline);
  // Readable once a neighbour was found frozen (never cleared); -1 before Start.
  int wake_fd() const { return wake_fd_; }
  // The neighbour found frozen (-1: none); cheap (one atomic load) when none.
  int frozen() const { return frozen_.load(std::memory_order_acquire); }
  double bound_s() const { return bound_s_; }
  // Stops the thread and closes the heartbeat sockets; idempotent.
  void Stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Watched {
    int peer = -1;
    int fd = -1;
    bool heard_once = false;  // watched only from its first byte on
    Clock::time_point heard;  // when its last byte arrived
  };
  void Loop();
  // One bounded try to connect to the first of to_connect_ (dropped, with a
  // warning, once connect_deadline_ passes).
  void ConnectNext();
  // Takes the connector's incoming sockets from the neighbours in to_accept_.
  void Adopt();
  // Reads what `w` sent; false when its socket closed or failed.
  bool Drain(Watched* w, Clock::time_point now);
  // A new connection: beat on it at once and start reading it.
  void Add(int peer, int fd);
  // Sends a beat to every neighbour, and records the first one silent past the bound.
  void BeatAndWatch(Clock::time_point now);

  int rank_, size_;
  double bound_s_;
  std::unique_ptr<PeerConnector> connector_;  // reset by the thread once every neighbour connected
  std::vector<int> neighbours_;               // every neighbour (set by Start, then read-only)
  std::vector<int> to_connect_, to_accept_;   // thread: neighbours above / below not yet connected
  Deadline connect_deadline_;
  std::vector<Watched> watched_;
  int wake_fd_ = -1;  // eventfd, signalled once when frozen_ is set
  int stop_fd_ = -1;  // eventfd: Stop() wakes the thread
  std::atomic<int> frozen_{-1};
  std::mutex heard_mu_;  // guards heard_ (AwaitFirstBeats)
  std::condition_variable heard_cv_;
  std::vector<int> heard_;  // neighbours whose first beat arrived
  std::thread thread_;
};

}  // namespace hvdlite
