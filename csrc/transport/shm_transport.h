// ShmTransport: the Transport for a job with several ranks on one host.
//
// Private to csrc/transport (others use CreateShmTransport in transport.h).
// It owns the "base" transport, a SteppedTransport (stepped.h; in practice the
// TCP mesh, which the factory in transport.cc builds), and, for each peer on
// the same host with which the segment exchange succeeded (a "linked" peer),
// four channels (shm_channel.h): control and data out (in this rank's
// segment), control and data in (in the peer's segment). Traffic to a linked
// peer goes through the channels; traffic to other peers goes through the
// base; a SendRecv may mix both.
//
// Data: a message is cut into slot-sized pieces; the sender copies each piece
// into a free slot and publishes it; the receiver copies it out (Recv) or
// reduces it straight into its buffer (SendRecvReduce: no copy on that side)
// and releases the slot. Sends and receives of one call progress together,
// so a ring step never deadlocks on full rings.
//
// Waiting (data and control sends and receives): poll the rings with no
// syscall for the spin budget (at most ShmOptions::spin_us, adapted to how
// recent waits ended: common/spin.h), then sleep in the base's WaitEvents:
// this rank's `sleeping` flag in its segment header asks peers to Nudge it
// through the base after they publish or release a slot of its (the flag is
// set, then the rings re-checked, then the sleep: so a publish is never
// missed). Sleeping on the base's connections also watches liveness: a peer
// that dies closes its socket, which ends the wait with Aborted naming it; a
// peer that is alive but silent for io_timeout_s is a Timeout. While a data
// transfer waits, incoming control pieces are drained into a queue, so a
// control sender never waits on a receiver busy with data.
//
// Threading and failure: as Transport (one thread at a time; the first error
// breaks the transport, and the base's Abort tells the peers).
#pragma once
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/spin.h"
#include "transport/shm_channel.h"
#include "transport/shm_segment.h"
#include "transport/stepped.h"
#include "transport/transport.h"

namespace hvdlite {

class ShmTransport : public Transport {
 public:
  // One peer's channels; `linked` is false for peers reached through the base.
  struct Link {
    bool linked = false;
    shm::Producer ctrl_out, data_out;
    shm::Consumer ctrl_in, data_in;
    std::atomic<uint32_t>* peer_sleeping = nullptr;  // in the peer's segment header
    std::string ctrl_partial;                        // control message being assembled
  };

  // `own` is this rank's segment (its `sleeping` flag is this rank's);
  // `mapped` keeps the peers' segments mapped; links[r] for every rank.
  ShmTransport(std::unique_ptr<SteppedTransport> base, shm::Segment own, std::vector<shm::Segment> mapped,
               std::vector<Link> links, const ShmOptions& opts, double io_timeout_s, bool oversubscribed);
  ~ShmTransport() override;

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }

  Status Send(int peer, uint32_t tag, const void* data, size_t len) override;
  Status Recv(int peer, uint32_t tag, void* data, size_t len) override;
  Status SendRecv(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len, int recv_peer,
                  uint32_t recv_tag, void* recv_data, size_t recv_len) override;
  Status SendRecvReduce(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                        int recv_peer, uint32_t recv_tag, void* recv_dst, size_t recv_len,
                        const Reducer& reducer) override;
  // Both exchanges in one transfer loop when a's peers are linked through
  // shared memory and b's go through the base; otherwise one after the other.
  Status SendRecvPair(const ExchangeSpec& a, const ExchangeSpec& b) override;

  Status SendControl(int peer, const std::string& payload) override;
  Status WaitControl(int wake_fd, int timeout_ms, std::vector<ControlMessage>* out) override;

  void Depart() override { base_->Depart(); }
  bool PeerDeparted(int peer) const override { return base_->PeerDeparted(peer); }
  int departures() const override { return base_->departures(); }
  bool Connected(int peer) const override { return base_->Connected(peer); }
  int open_sockets() const override { return base_->open_sockets(); }
  void Close() override;

  P2pArenaView OwnP2pArena() override { return {own_.arena(), own_.arena_bytes()}; }
  P2pArenaView PeerP2pArena(int peer) override {
    if (!Linked(peer)) return {};
    return {mapped_[peer].arena(), mapped_[peer].arena_bytes()};
  }
  Status ReserveP2pArena(size_t bytes) override { return own_.ReserveArena(bytes); }

  // Number of peers reached through shared memory (for tests and logs).
  int linked_peers() const;

 private:
  // Everything one call moves: at most one send and one receive, each
  // either through shared memory (ss, sr: an empty message still takes one
  // slot) or through the base (bs, br). Ops: stepped.h.
  struct Transfer {
    SendOp ss;
    RecvOp sr;
    SendOp bs;
    RecvOp br;
    bool done() const { return ss.done && sr.done && bs.done && br.done; }
  };

  bool Linked(int peer) const { return peer >= 0 && peer < size() && links_[peer].linked; }
  Status CheckPeer(int peer, const char* what) const;
  Status Exchange(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len, int recv_peer,
                  uint32_t recv_tag, void* recv_data, size_t recv_len, const Reducer* reducer);
  Status SelfExchange(uint32_t send_tag, const void* send_data, size_t send_len, uint32_t recv_tag,
                      void* recv_data, size_t recv_len, const Reducer* reducer);
  Status Run(Transfer* t);
  Status Step(Transfer* t, bool* progressed);
  bool Push(SendOp* s);
  Status Pull(RecvOp* r, bool* progressed);
  Status Sleep(Transfer* t);
  Status PeersAlive(const Transfer& t) const;
  Status TimeoutError(const Transfer& t) const;

  // Moves complete control messages from every linked peer into ctrl_queue_.
  Status DrainControl();
  Status OnControlPiece(int peer, const shm::SlotHeader& h, const char* payload);
  void NudgeIfSleeping(int peer);
  Status Fail(const Status& st) { return base_->Abort(st); }

  std::unique_ptr<SteppedTransport> base_;  // the full mesh; liveness and doorbell
  shm::Segment own_;
  std::vector<shm::Segment> mapped_;
  std::vector<Link> links_;
  std::vector<int> linked_ids_;  // ranks of the linked peers
  ShmOptions opts_;
  double io_timeout_s_;
  bool yield_;                             // spin by yielding: more busy ranks than cores on this host
  SpinBudget data_spin_;                   // how long transfers poll before sleeping (common/spin.h)
  std::atomic<uint32_t>* sleeping_;        // this rank's flag, in own_
  std::deque<ControlMessage> ctrl_queue_;  // complete control messages not yet returned
  std::vector<ControlMessage> base_ctrl_;  // scratch for the base's WaitEvents
  std::chrono::steady_clock::time_point last_socket_check_{};  // WaitControl(timeout 0)
  bool closed_ = false;
};

// Shared memory per member of a host: every data ring of a member shares this
// budget (at most ShmOptions::channel_bytes each, at least the minimum).
constexpr size_t kShmBudgetBytes = 3u << 20;
constexpr size_t kShmMinChannelBytes = 128u << 10;

// The partners of local member `me` among `local_size` (local indices,
// ascending, without me): ring neighbours, me ^ 2^k below the largest power
// of two p2 <= local_size, and me -+ p2 (recursive doubling's fold). The
// relation is symmetric.
std::vector<int> HostPartners(int me, int local_size);
// The global ranks of `rank`'s partners on its host (hosts[r]: r's host).
std::vector<int> ShmPartnerRanks(const std::vector<std::string>& hosts, int rank);

// CreateShmTransport's shared-memory half (shm_setup.cc), over `base`, the
// transport to every rank that transport.cc has already connected (its rank
// and size are this job's). Runs the segment exchange with the ranks on this
// host (equal hosts[r]) through `store`, bounded by connect_timeout_s. *out is
// a ShmTransport that owns `base`, or `base` itself when opts.disable is set
// or no peer on this host could be linked.
Status AddSharedMemory(std::unique_ptr<SteppedTransport> base, Store* store, const std::string& prefix,
                       const std::string& secret, double connect_timeout_s, double io_timeout_s,
                       const std::vector<std::string>& hosts, const ShmOptions& opts,
                       std::unique_ptr<Transport>* out);

}  // namespace hvdlite
