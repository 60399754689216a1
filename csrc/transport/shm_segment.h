// Shared-memory segments of the shm transport (private to csrc/transport).
//
// Each rank owns one POSIX shared-memory segment holding the channels it
// produces: for each of its partners on its host (shm_setup.cc), a control
// channel and a data channel (shm_channel.h). Peers map it read-write (consumers write their
// tail counters into it) and the owner unlinks its name as soon as the peers
// have mapped it, so the memory lives exactly as long as some process maps it.
//
// Layout: [SegmentHeader][pair 0: control channel | data channel][pair 1]...
// [padding to kArenaAlign][point-to-point arena], where pair k serves the
// owner's k-th partner (HostPartners order). The rings are mapped with every
// page populated; the arena (Geometry::arena_bytes, possibly 0) is a separate
// mapping that is not: its pages exist only once the owner reserves them
// (Segment::ReserveArena), so /dev/shm holds only what point-to-point used.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/shm_channel.h"

namespace hvdlite {
namespace shm {

constexpr uint64_t kMagic = 0x314d485344564848ull;  // "HHVDSHM1"
constexpr uint32_t kVersion = 2;
// Alignment of the arena within the segment: a multiple of every page size.
constexpr size_t kArenaAlign = 64 << 10;

// Channel geometry, chosen by the owner and read by peers from its header.
struct Geometry {
  uint32_t ctrl_slots = 8;
  uint64_t ctrl_slot_bytes = 8 << 10;
  uint32_t data_slots = 8;
  uint64_t data_slot_bytes = 128 << 10;
  uint64_t arena_bytes = 0;  // the point-to-point arena (a multiple of kArenaAlign)

  size_t PairBytes() const {
    return ChannelBytes(ctrl_slots, ctrl_slot_bytes) + ChannelBytes(data_slots, data_slot_bytes);
  }
};

// A data ring of about `channel_bytes`, in `data_slots` slots (64-byte multiples, at least 4 KiB).
Geometry MakeGeometry(size_t channel_bytes);

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t owner;      // global rank
  uint64_t nonce[2];  // random, published with the name: proves it is this job's segment
  uint32_t pairs;     // channel pairs that follow
  uint32_t reserved;
  Geometry geometry;
  // Set by the owner while it sleeps (or is about to) in a wait; whoever
  // publishes into or releases a slot of the owner's then nudges it (through
  // the base transport: stepped.h).
  alignas(kLine) std::atomic<uint32_t> sleeping;
};

inline size_t HeaderBytes() { return RoundUp(sizeof(SegmentHeader), kLine); }
// Header and rings, padded so that the arena after them is page-aligned.
inline size_t RingsBytes(const Geometry& g, uint32_t pairs) {
  return RoundUp(HeaderBytes() + pairs * g.PairBytes(), kArenaAlign);
}
inline size_t SegmentBytes(const Geometry& g, uint32_t pairs) { return RingsBytes(g, pairs) + g.arena_bytes; }

// Control and data channels of pair `k` in a mapped segment.
ChannelView ControlChannel(char* base, const Geometry& g, uint32_t k);
ChannelView DataChannel(char* base, const Geometry& g, uint32_t k);

// One mapping of a named segment. Move-only; unmaps on destruction, and
// unlinks the name first if this object created it and has not unlinked yet.
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates `name` (O_EXCL, mode 0600) for `pairs` channel pairs of geometry
  // `g`, maps its rings with every page populated (zeroed: every counter
  // starts at 0) and its arena without, and writes the header. The creator
  // keeps the file open for ReserveArena.
  static Status Create(const std::string& name, const Geometry& g, uint32_t pairs, int owner,
                       const uint64_t nonce[2], Segment* out);
  // Maps an existing segment and checks its header (magic, version, owner,
  // nonce, size).
  static Status Open(const std::string& name, int owner, const uint64_t nonce[2], Segment* out);

  // Removes the name (the mapping stays valid). Idempotent.
  void Unlink();
  bool mapped() const { return base_ != nullptr; }
  char* base() const { return base_; }
  // The point-to-point arena (nullptr when its size is 0).
  char* arena() const { return arena_; }
  size_t arena_bytes() const { return arena_bytes_; }
  // Creator only: backs the arena's first `bytes` bytes with memory
  // (fallocate; idempotent for what is already backed), so that writing them
  // can never fault on a full /dev/shm. Fails (Precondition naming
  // /dev/shm) when the memory is not there; the arena is then unusable.
  Status ReserveArena(size_t bytes);
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }

 private:
  void Reset();
  Status MapArena(int fd, const std::string& name);
  std::string name_;
  char* base_ = nullptr;  // header and rings
  size_t bytes_ = 0;
  char* arena_ = nullptr;  // a second mapping, of the arena
  size_t arena_bytes_ = 0;
  size_t reserved_ = 0;  // arena bytes backed so far (creator)
  int fd_ = -1;          // creator: kept open for ReserveArena
  bool linked_ = false;  // created here and not yet unlinked
};

}  // namespace shm
}  // namespace hvdlite
