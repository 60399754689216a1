// P2pEngine: point-to-point send/recv between two ranks of a process set,
// matched by (process set, source, tag), with no coordinator round trip and
// no other rank involved.
//
// Route. A message to a peer linked through shared memory, longer than
// P2pArenaLane::kInlineBytes, is written piece by piece into this rank's
// point-to-point arena, and only frames naming where each piece lies travel
// (runtime/p2p_arena.h). Everything else travels on the transport's control
// plane as P2P chunk frames (ControlKind::kP2pChunk): every transport already reads control messages as
// they arrive and queues them (WaitControl, and during data transfers), so a
// message nobody has asked for yet never blocks the engine, a collective or
// the data plane's tag order. A message is cut into chunks of at most
// kChunkBytes; the receiver's engine acknowledges each chunk it has taken in
// (kP2pAck), and a sender keeps at most kWindowBytes unacknowledged per peer.
// The window keeps what a pair has in flight under the TCP socket buffers
// (kSocketBufferBytes), so two ranks sending large messages to each other at
// once never both block in SendControl (TCP does not read while it sends a
// control message; shared memory does).
//
// Matching. Chunks of one message are contiguous per pair (a sender sends its
// messages to one peer in the order posted, one at a time), and messages
// between a pair with equal (set, tag) are received in the order sent (MPI's
// non-overtaking rule). A message whose receive is not posted yet is kept
// ("unexpected") until one matches it; their total size is bounded by
// HVDLITE_P2P_UNEXPECTED_BYTES, past which the job fails with an error naming
// the pair and tag (the sender never waits for the receiver to post).
//
// Completion. A send's handle completes once its last chunk was handed to the
// transport (its buffer may then be reused); a receive's once its buffer holds
// the message. A receive whose message does not come within
// HVDLITE_TIMEOUT_SECONDS fails with Timeout naming the (rank, tag) pair and
// the tags that did arrive from that rank; one from a rank that shut down
// fails at once. A message of another size than the receive's buffer fails
// that receive, naming tensor, pair and both sizes.
//
// A send to a rank that has shut down fails (Aborted, naming it).
//
// CUDA tensors (Op::device >= 0) go through the NCCL module's point-to-point
// (GpuBackend::StartP2p) instead of the control plane, matched by the same
// rules; see p2p_device.cc for the hand-shake that orders a pair's transfers
// alike on both sides. A CUDA send, unlike a host one, waits for its receive
// (bounded by HVDLITE_TIMEOUT_SECONDS). Both sides must be CUDA tensors.
//
// Deadlocks. A caller blocked on a receive is reported to the coordinator's
// deadlock detector like one blocked in a collective (TensorQueue::AddP2pRecv;
// coordinator/deadlock.h): when its source is itself blocked in something
// that needs this rank first, the coordinator fails the receive on this rank
// (FailDeadlocked) with an error naming the (rank, tag) pair, the process set
// and the fix, long before HVDLITE_TIMEOUT_SECONDS. While sends are in flight
// the rank tells the queue (SetP2pSending), and for kSendingGrace after, so a
// peer waiting for them is not deadlocked (nor one whose report that they
// arrived is still on its way to the coordinator).
//
// Threading: Post() from any thread; everything else is the engine's (the
// holder of the runtime's engine_mu_).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/gpu_backend.h"
#include "common/status.h"
#include "coordinator/process_sets.h"
#include "runtime/handles.h"
#include "runtime/p2p_arena.h"
#include "runtime/tensor_queue.h"
#include "transport/transport.h"

namespace hvdlite {

class P2pEngine {
 public:
  static constexpr size_t kChunkBytes = 256 << 10;
  static constexpr size_t kWindowBytes = 1 << 20;
  // Sends this long fit the peer's shared-memory control channel (64 KiB) without waiting
  // for it to drain.
  static constexpr size_t kQuickSendBytes = 16 << 10;

  // What a caller posts: a send of `bytes` bytes at `data` to member `peer`
  // of `process_set`, or a receive into it from that member.
  struct Op {
    bool send = false;
    std::string name;  // the tensor's name, for errors
    char* data = nullptr;
    size_t bytes = 0;
    int32_t peer = -1;  // rank in process_set
    int32_t tag = 0;
    int32_t process_set = 0;
    int32_t device = -1;  // CUDA device of `data`; -1: host memory
  };

  // The runtime wakes a sleeping engine after a Post (HasNew); timeout_s is
  // HVDLITE_TIMEOUT_SECONDS, unexpected_limit HVDLITE_P2P_UNEXPECTED_BYTES.
  P2pEngine(int rank, Transport* transport, ProcessSetTable* sets, HandleTable* handles, TensorQueue* queue,
            double timeout_s, int64_t unexpected_limit);

  // Any thread: checks `op` (process set, ranks, tag) and queues it for the
  // engine; *handle completes as described above. Errors return at once.
  // *waits_for_peer: starting this send may block until the peer's engine
  // drains the control channel (a host send longer than kQuickSendBytes that
  // does not go through the arena), so the posting thread should leave it to
  // the background thread; false for receives.
  Status Post(Op op, int64_t* handle, bool* waits_for_peer);
  // Engine: posts arrived that the engine has not taken yet (Post's count is
  // seq_cst, so a check after TensorQueue::SetSleeping(true) cannot miss one).
  bool HasNew() const { return posted_.load(std::memory_order_seq_cst) != taken_; }
  // Engine: some host send is still queued (its peer's window or the arena is full).
  bool SendsQueued() const;

  // Engine: CUDA transfers are queued on the GPU. Their completion wakes
  // nothing, so the engine's waits must then be short (they are polled).
  bool DeviceBusy() const { return !device_running_.empty(); }
  // Any thread, before the first Post of a CUDA tensor: the NCCL module.
  void SetGpu(GpuBackend* gpu) { gpu_.store(gpu); }

  // Engine: true for the control payloads this engine owns.
  static bool Owns(const std::string& payload);
  // Engine: a chunk or acknowledgement from global rank `peer`. An error is
  // fatal (unexpected messages over their bound, a corrupt stream).
  Status OnControl(int peer, const std::string& payload);
  // Engine: takes new posts, sends what the windows allow, fails receives
  // that waited too long or whose sender left. An error is fatal (a peer
  // that takes no data for HVDLITE_TIMEOUT_SECONDS, a transport failure).
  Status Progress();
  // Engine: the coordinator found the oldest posted receive of tensor `name`
  // from global rank `src` with `tag` in `process_set` deadlocked: it fails
  // with `why` (no-op when it has completed meanwhile).
  void FailDeadlocked(int32_t process_set, const std::string& name, int src, int32_t tag, const Status& why);

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {  // a posted operation, in the engine
    Op op;
    int64_t handle = 0;
    int peer = -1;  // global rank
    size_t done = 0;
    Clock::time_point since;
    std::list<Pending>::iterator self;  // where ops_ holds it
  };
  using ChunkHeader = P2pChunkHeader;
  struct Unexpected {  // a message no receive has matched yet
    int peer = -1;
    int32_t process_set = 0;
    int32_t tag = 0;
    uint64_t total = 0;
    std::unique_ptr<char[]> bytes;  // total bytes (at least 1)
    uint64_t got = 0;
    Pending* recv = nullptr;  // the receive that matched it
    bool discard = false;     // a receive of another size matched it and failed
    bool device = false;      // a CUDA send's announcement (no bytes): its id, and
    uint64_t device_id = 0;   // the send itself when this rank sends to itself
    Pending* self_send = nullptr;
  };
  struct DeviceTransfer {  // queued on the GPU (the NCCL module's ticket)
    int64_t ticket = 0;
    Pending* send = nullptr;  // this rank's sides of it (one or both)
    Pending* recv = nullptr;
    int peer = -1;
    Clock::time_point since;
  };
  using DeviceKey = std::pair<int, uint64_t>;  // (peer's global rank, the send's id)
  struct Incoming {                            // the message a peer is sending now
    bool active = false;
    ChunkHeader header;
    uint64_t got = 0;
    Pending* recv = nullptr;                     // the matched receive, or
    bool has_unexpected = false;                 // where it is kept until one matches;
    std::list<Unexpected>::iterator unexpected;  // neither: dropped (a size mismatch)
  };
  struct Outbox {
    std::deque<Pending*> sends;
    size_t unacked = 0;
    Clock::time_point waiting_since;  // for an acknowledgement, while the window is full
    bool active = false;              // listed in active_peers_
  };

  Status TakePosted();
  Status PostRecv(Pending* r);
  Status SendSome(int peer, Outbox* box);
  Status SendPiece(int peer, Outbox* box, Pending* s, bool* sent);
  Status WaitForRoom(int peer, Outbox* box, const Pending& s);
  Status OnArenaChunk(int peer, const std::string& payload);
  Status Deliver(int peer, const ChunkHeader& h, const char* payload, size_t len);
  Status StartMessage(int peer, const ChunkHeader& h, Incoming* in);
  void ReleaseUnexpected(std::list<Unexpected>::iterator it);
  void Finish(Pending* p, Status st);
  Status SizeMismatch(const Pending& r, uint64_t total) const;
  std::string Describe(const Pending& p) const;
  std::string UnreceivedTags(int peer, int32_t process_set) const;
  void CheckRecvDeadlines();
  // p2p_device.cc: CUDA tensors.
  Status AnnounceDevice(int peer, Pending* s);
  Status OnDeviceControl(int peer, const std::string& payload);
  Status DeviceArrived(int peer, const ChunkHeader& h, uint64_t id, Pending* self_send);
  Status MatchDevice(int peer, Pending* r, uint64_t id, uint64_t total, Pending* self_send);
  void StartDevice(Pending* send, Pending* recv, int peer);
  void FinishDevice(Pending* send, Pending* recv, const Status& st);
  Status SendDeviceFrame(int peer, ControlKind kind, uint64_t id, const Status& st);
  Status KindMismatch(const Pending& r, bool message_on_device) const;
  void PollDevice();

  const int rank_;
  Transport* transport_;
  ProcessSetTable* sets_;
  HandleTable* handles_;
  TensorQueue* queue_;
  const double timeout_s_;
  const int64_t unexpected_limit_;

  std::mutex mu_;  // guards inbox_
  std::vector<Pending*> inbox_;
  std::atomic<uint64_t> posted_{0};
  uint64_t taken_ = 0;  // posted_ as of the last TakePosted (engine)

  // Engine state. Pending objects are owned here (std::list: stable addresses).
  std::list<Pending> ops_;
  std::vector<Outbox> outboxes_;    // by global rank
  std::vector<int> active_peers_;   // ranks whose outbox has sends or unacknowledged bytes:
                                    // Progress walks these, not every rank (O(busy peers) a turn)
  bool reported_sending_ = false;   // the queue was last told this rank is sending
  std::vector<Incoming> incoming_;  // by global rank
  P2pArenaLane arena_;
  std::list<Pending*> posted_recvs_;  // unmatched receives, in posting order
  std::list<Unexpected> unexpected_;  // unmatched messages, in arrival order
  int64_t unexpected_bytes_ = 0;
  std::atomic<GpuBackend*> gpu_{nullptr};
  uint64_t next_device_id_ = 1;
  std::map<DeviceKey, Pending*> device_sends_;  // CUDA sends announced, awaiting their receiver's reply
  std::map<DeviceKey, Pending*> device_recvs_;  // CUDA receives matched, awaiting the sender's go
  std::vector<DeviceTransfer> device_running_;
  static constexpr std::chrono::milliseconds kSendingGrace{250};
  Clock::time_point last_sending_;  // when sends were last in flight
};

}  // namespace hvdlite
