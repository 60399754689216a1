// Transport: moves tagged byte messages between two ranks of the job.
//
// Two planes share one connection per pair of ranks:
//  * data: Send/Recv/SendRecv move exactly `len` bytes for a given tag; the
//    receiver names the tag it expects and a different tag on the wire is an
//    Internal error naming both tags (it means the ranks disagree on order).
//  * control: small messages (negotiation requests/responses). A control
//    message that arrives while a data receive is in progress is queued and
//    handed out by WaitControl() later, so the two planes never block each other.
//
// Threading: a Transport is driven by one thread at a time (the runtime's
// background thread); it is not thread-safe.
// Blocking: every call is bounded. A data call fails with Timeout when no byte
// moves for `io_timeout_s` (set at creation), and with Aborted naming the peer
// as soon as that peer's connection is closed or reset. After any failure the
// transport is broken: every later call fails fast with the first error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

class Store;

// The longest control message any transport carries (a longer one is refused
// by SendControl, and seen on the wire it means a corrupt stream).
constexpr uint64_t kMaxControlLen = 1ull << 30;

struct ControlMessage {
  int peer = -1;
  std::string payload;
};

// How a receiver combines an incoming message with what its buffer holds:
// fn(ctx, dst, src, bytes) sets dst[i] = op(dst[i], src[i]) over `bytes`
// bytes. Every call covers whole elements (a multiple of `unit` bytes, at an
// offset that is a multiple of `unit` from the start of the message). `src`
// may point into memory another process is allowed to read but never writes
// while the call runs (a shared-memory slot). Must not block.
struct Reducer {
  Status (*fn)(const void* ctx, void* dst, const void* src, size_t bytes) = nullptr;
  const void* ctx = nullptr;
  size_t unit = 1;
};

// One side of SendRecvPair: what SendRecv / SendRecvReduce take (reducer null
// for a plain copy). send_peer or recv_peer -1 skips that direction.
struct ExchangeSpec {
  int send_peer = -1;
  uint32_t send_tag = 0;
  const void* send_data = nullptr;
  size_t send_len = 0;
  int recv_peer = -1;
  uint32_t recv_tag = 0;
  void* recv_data = nullptr;
  size_t recv_len = 0;
  const Reducer* reducer = nullptr;  // not owned; alive until the call returns
};

// A point-to-point arena (see Transport::OwnP2pArena): `bytes` bytes at `base`.
struct P2pArenaView {
  char* base = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Status Send(int peer, uint32_t tag, const void* data, size_t len) = 0;
  virtual Status Recv(int peer, uint32_t tag, void* data, size_t len) = 0;
  // Sends to send_peer while receiving from recv_peer, both progressing together
  // (so a ring step cannot deadlock on full socket buffers). Either peer may be
  // -1 to skip that side; a zero length still exchanges an empty message.
  virtual Status SendRecv(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                          int recv_peer, uint32_t recv_tag, void* recv_data, size_t recv_len) = 0;

  // SendRecv whose received message is reduced into recv_dst (through
  // `reducer`) instead of copied; the message on the wire is an ordinary one,
  // so the sender may use Send/SendRecv. recv_dst must not overlap send_data.
  // A shared-memory transport reduces straight out of the sender's slots (no
  // copy on the receiving side); the default receives into a temporary buffer.
  virtual Status SendRecvReduce(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                                int recv_peer, uint32_t recv_tag, void* recv_dst, size_t recv_len,
                                const Reducer& reducer);

  // Two exchanges with disjoint peers, `a` and `b`, each as SendRecv (or
  // SendRecvReduce when its reducer is set). A transport that can progress
  // both at once does (the shared-memory transport, when a's peers are reached
  // through shared memory and b's through TCP); the default runs a, then b.
  // Callers must therefore keep the pair deadlock-free when run in that order:
  // every member of a's exchange pattern runs its `a` before its `b`.
  virtual Status SendRecvPair(const ExchangeSpec& a, const ExchangeSpec& b);

  virtual Status SendControl(int peer, const std::string& payload) = 0;
  // Returns when control messages are available (appends all of them to `out`),
  // when `wake_fd` (may be -1) becomes readable, or after timeout_ms (-1 =
  // no timeout is not allowed; pass a bound). A peer that closed its connection
  // without first calling Depart() is an Aborted error naming that rank; a
  // departed peer's close is not an error.
  virtual Status WaitControl(int wake_fd, int timeout_ms, std::vector<ControlMessage>* out) = 0;

  // Tells every peer this rank is leaving on purpose, so its close is not
  // reported as a crash. Used by shutdown.
  virtual void Depart() = 0;
  // True once `peer` has sent Depart().
  virtual bool PeerDeparted(int peer) const = 0;
  // How many peers have departed so far: a caller that polls PeerDeparted
  // every engine turn looks again only when this changed.
  virtual int departures() const = 0;
  // True while this rank holds a connection to `peer` (connections open on
  // demand: a peer this rank never exchanged with has none, and has nothing to
  // say when it departs).
  virtual bool Connected(int peer) const = 0;
  // Point-to-point arena: shared memory of this rank that every peer linked
  // through shared memory maps, so that a message can be handed over by
  // reference (the runtime's P2pEngine writes it there and sends only its
  // offset on the control plane; the peer copies it out and says so). Empty
  // for transports without shared memory and when HVDLITE_P2P_ARENA_BYTES is
  // 0. The transport does not manage its contents: the P2pEngine does.
  virtual P2pArenaView OwnP2pArena() { return {}; }
  // `peer`'s arena, as this rank maps it: empty unless the two are linked
  // through shared memory (then each maps the other's arena) and it has one.
  virtual P2pArenaView PeerP2pArena(int peer) {
    (void)peer;
    return {};
  }
  // Backs the first `bytes` bytes of this rank's arena with memory, so that
  // writing them cannot fault; Precondition when /dev/shm has no room.
  virtual Status ReserveP2pArena(size_t bytes) {
    (void)bytes;
    return Status::NotSupported("this transport has no point-to-point arena");
  }

  // Sockets this rank holds for the transport (tests and scale reports).
  virtual int open_sockets() const = 0;
  // Closes every connection; later calls fail with Aborted.
  virtual void Close() = 0;
};

// How long a silent peer's socket lives before it fails (HVDLITE_LIVENESS_SECONDS).
constexpr int kDefaultLivenessS = 4;

// The TCP transport: listens on an ephemeral port of `advertise_host` for the
// transport's whole life, publishes "<prefix>addr/<rank>" in the store, and
// connects to its ring neighbours before returning; every other pair connects
// on first use (tcp_transport.h, "Connections"). Each connection is
// authenticated both ways with an HMAC-SHA256 challenge over the raw
// `secret`; a stranger on the port (garbage, HTTP, a wrong proof, silence) is
// dropped without disturbing anything. `store` must outlive the transport (it
// gives later connections their peer's address). A rank therefore holds
// sockets to the peers it exchanges with, not to every rank.
Status CreateTcpTransport(Store* store, const std::string& prefix, int rank, int size,
                          const std::string& advertise_host, const std::string& secret,
                          double connect_timeout_s, double io_timeout_s, std::unique_ptr<Transport>* out,
                          int liveness_s = kDefaultLivenessS);

// Options of the shared-memory transport (HVDLITE_SHM_* settings).
struct ShmOptions {
  bool disable = false;            // TCP only
  size_t channel_bytes = 1 << 20;  // data ring per ordered pair of partners (at most; shm_setup.cc)
  double spin_us = 50;             // a wait busy-polls this long before it sleeps
  size_t p2p_arena_bytes = 0;      // each rank's point-to-point arena (HVDLITE_P2P_ARENA_BYTES)
};

// CreateTcpTransport, plus shared memory between the ranks that share a host
// (equal hosts[r]) and are partners (shm_setup.cc: the pairs the algorithms
// use, so a host's shared memory grows with its ranks, not with its pairs):
// data and control between partners move through single-producer/single-
// consumer rings in segments the ranks map from each other; their TCP
// connections, opened at creation, stay as the liveness channel (a peer's
// death is its socket closing, and a sleeping waiter is woken by a small TCP
// frame). Everything else goes over TCP. Segments are named from the
// secret and prefix, created 0600 and unlinked as soon as every peer has mapped
// them (or given up), so nothing is left in /dev/shm once this returns. A pair
// of ranks that cannot both map each other's segment falls back to TCP; with
// opts.disable, or no peer on this host, the result is the plain TCP transport.
Status CreateShmTransport(Store* store, const std::string& prefix, int rank, int size,
                          const std::string& advertise_host, const std::string& secret,
                          double connect_timeout_s, double io_timeout_s,
                          const std::vector<std::string>& hosts, const ShmOptions& opts,
                          std::unique_ptr<Transport>* out, int liveness_s = kDefaultLivenessS);

}  // namespace hvdlite
