// The point-to-point engine's shared-memory lane (runtime/p2p.h): a message
// piece to a peer linked through shared memory is written once into this
// rank's arena (Transport::OwnP2pArena), and only a small frame naming where
// it lies travels on the control ring; the receiver copies it straight from
// the arena into the receiving tensor (or into its unexpected-message store)
// and frees the region with a second small frame. Against sending the bytes
// themselves through the control ring (8 KiB slots), each byte is copied twice
// instead of four times and a piece of megabytes costs the two engines one
// hand-off each instead of one per ring-full, which on a host with more busy
// threads than cores is a scheduler wake-up each.
//
// Frames (little-endian, as the rest of the wire):
//   kP2pArenaChunk: kind u8, process set i32, tag i32, total u64, offset u64,
//                   arena offset u64, length u64
//   kP2pArenaFree:  kind u8, arena offset u64
//
// Ownership: a region belongs to the sender from Allocate until the peer's
// free arrives; the receiver only reads it, between the chunk frame and its
// free. A receiver frees every piece as soon as it has copied it, whether or
// not a receive was posted (unmatched messages are copied out to the engine's
// unexpected store), so the arena never waits on user code, only on the peer's
// engine: a sender whose arena stays full past HVDLITE_TIMEOUT_SECONDS fails
// like one whose window does (p2p.cc). Regions of a peer that departed are
// reclaimed by the sender (PeerLeft).
//
// Threading: the engine's only (the holder of the runtime's engine_mu_).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

// Where a piece of a point-to-point message belongs: its message's (process
// set, tag), the message's total bytes, and the piece's offset within it.
// Its wire form, in the chunk frames of both routes (p2p.cc, here):
// process set i32, tag i32, total u64, offset u64.
struct P2pChunkHeader {
  int32_t process_set = 0;
  int32_t tag = 0;
  uint64_t total = 0;
  uint64_t offset = 0;

  static constexpr size_t kWireBytes = 4 + 4 + 8 + 8;
  void Write(char* at) const {
    std::memcpy(at, &process_set, 4);
    std::memcpy(at + 4, &tag, 4);
    std::memcpy(at + 8, &total, 8);
    std::memcpy(at + 16, &offset, 8);
  }
  static P2pChunkHeader Read(const char* at) {
    P2pChunkHeader h;
    std::memcpy(&h.process_set, at, 4);
    std::memcpy(&h.tag, at + 4, 4);
    std::memcpy(&h.total, at + 8, 8);
    std::memcpy(&h.offset, at + 16, 8);
    return h;
  }
};

// The sender's bookkeeping of which arena bytes hold pieces not yet freed.
// Regions are handed out as a ring, oldest first: a new one goes after the
// newest, or at offset 0 when it would run past the end; frees come in any
// order, and the oldest freed regions are reclaimed together. O(1) amortized
// per allocation; the live list is as long as the pieces in flight.
class ArenaRing {
 public:
  explicit ArenaRing(uint64_t capacity) : capacity_(capacity) {}
  // A free run of `bytes` (> 0) for `peer`: false when there is none now.
  bool Allocate(uint64_t bytes, int peer, uint64_t* offset);
  // Frees `peer`'s region at `offset` (*bytes: its size); false when it
  // holds none there.
  bool Free(uint64_t offset, int peer, uint64_t* bytes);
  // Frees every region `peer` holds.
  void FreePeer(int peer);
  uint64_t capacity() const { return capacity_; }

 private:
  struct Region {
    uint64_t offset = 0, bytes = 0;
    int peer = -1;
    bool freed = false;
  };
  void Reclaim();
  const uint64_t capacity_;
  std::deque<Region> live_;  // in allocation order
  uint64_t head_ = 0;        // end of the newest region
};

class P2pArenaLane {
 public:
  // Pieces at most this long (a quarter of the arena at most), and messages
  // at most kInlineBytes long go through the control ring as before.
  static constexpr size_t kPieceBytes = 4 << 20;
  static constexpr size_t kInlineBytes = 8 << 10;

  // `transport` outlives the lane; `size` is the job's size.
  P2pArenaLane(Transport* transport, int size);

  // True when pieces to global rank `peer` go through the arena. Any thread
  // (P2pEngine::Post asks it too).
  bool Usable(int peer) const;
  // The longest piece to send at once.
  size_t piece_bytes() const { return piece_; }
  // Copies `len` bytes at `data` into the arena and sends their frame to
  // `peer` with header `h`; *sent is false (nothing done) when the arena has
  // no room now, or `peer` already holds half of it (so one slow receiver
  // never takes the arena from the others). A failure to back the arena with memory turns the lane off
  // (logged once; later pieces take the control ring) and leaves *sent false.
  Status Send(int peer, const P2pChunkHeader& h, const char* data, size_t len, bool* sent);
  // A kP2pArenaChunk frame from `peer`: its header, and where its bytes lie
  // in the peer's arena (valid until Release).
  Status Open(int peer, const std::string& frame, P2pChunkHeader* h, const char** bytes, size_t* len,
              uint64_t* arena_offset) const;
  // Tells `peer` that its piece at `arena_offset` was taken in.
  Status Release(int peer, uint64_t arena_offset);
  // A kP2pArenaFree frame from `peer`.
  Status OnFree(int peer, const std::string& frame);
  // Bytes `peer` holds in this rank's arena.
  uint64_t held(int peer) const { return held_[static_cast<size_t>(peer)]; }
  // `peer` left: what it held is reclaimed.
  void PeerLeft(int peer);

 private:
  Transport* transport_;
  P2pArenaView own_;
  std::atomic<bool> enabled_;  // written by the engine only
  size_t piece_;
  ArenaRing ring_;
  std::vector<uint64_t> held_;  // by global rank
};

}  // namespace hvdlite
