#include "runtime/p2p_arena.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "coordinator/messages.h"

namespace hvdlite {
namespace {

// kind, the chunk header, arena offset, length.
constexpr size_t kChunkFrameBytes = 1 + P2pChunkHeader::kWireBytes + 8 + 8;
constexpr size_t kArenaOffsetAt = 1 + P2pChunkHeader::kWireBytes;
constexpr size_t kFreeFrameBytes = 1 + 8;
constexpr uint64_t kAlign = 64;             // regions start on cache lines
constexpr uint64_t kReserveStep = 1 << 20;  // the arena is backed a megabyte at a time

}  // namespace

bool ArenaRing::Allocate(uint64_t bytes, int peer, uint64_t* offset) {
  const uint64_t n = (bytes + kAlign - 1) / kAlign * kAlign;
  if (n == 0 || n > capacity_) return false;
  uint64_t at = 0;
  if (!live_.empty()) {
    const uint64_t tail = live_.front().offset;
    if (head_ > tail) {  // live bytes are [tail, head_): room after head_, or before tail
      if (head_ + n <= capacity_) {
        at = head_;
      } else if (n <= tail) {
        at = 0;
      } else {
        return false;
      }
    } else if (head_ + n <= tail) {  // wrapped: live bytes are [tail, end) and [0, head_)
      at = head_;
    } else {
      return false;
    }
  }
  live_.push_back(Region{at, n, peer, false});
  head_ = at + n;
  *offset = at;
  return true;
}

bool ArenaRing::Free(uint64_t offset, int peer, uint64_t* bytes) {
  for (Region& r : live_) {
    if (r.offset != offset || r.peer != peer || r.freed) continue;
    r.freed = true;
    *bytes = r.bytes;
    Reclaim();
    return true;
  }
  return false;
}

void ArenaRing::FreePeer(int peer) {
  for (Region& r : live_) r.freed = r.freed || r.peer == peer;
  Reclaim();
}

void ArenaRing::Reclaim() {
  while (!live_.empty() && live_.front().freed) live_.pop_front();
  if (live_.empty()) head_ = 0;
}

P2pArenaLane::P2pArenaLane(Transport* transport, int size)
    : transport_(transport),
      own_(transport->OwnP2pArena()),
      enabled_(own_.base != nullptr && own_.bytes > 0),
      piece_(std::max<size_t>(kInlineBytes, std::min(kPieceBytes, own_.bytes / 4))),
      ring_(own_.bytes),
      held_(static_cast<size_t>(size), 0) {}

bool P2pArenaLane::Usable(int peer) const {
  return enabled_ && peer != transport_->rank() && transport_->PeerP2pArena(peer).base != nullptr;
}

Status P2pArenaLane::Send(int peer, const P2pChunkHeader& h, const char* data, size_t len, bool* sent) {
  *sent = false;
  uint64_t at = 0;
  if (held_[static_cast<size_t>(peer)] + len > ring_.capacity() / 2 || !ring_.Allocate(len, peer, &at))
    return Status::OK();
  // Backed a megabyte at a time (a no-op once backed: the segment keeps the mark).
  const uint64_t want =
      std::min<uint64_t>(own_.bytes, (at + len + kReserveStep - 1) / kReserveStep * kReserveStep);
  Status st = transport_->ReserveP2pArena(want);
  if (!st.ok()) {
    HVD_LOG(kWarning, "point-to-point messages go through the control ring from now on: " << st.message());
    enabled_ = false;
    uint64_t ignored = 0;
    ring_.Free(at, peer, &ignored);
    return Status::OK();
  }
  if (len > 0) std::memcpy(own_.base + at, data, len);
  std::string f(kChunkFrameBytes, '\0');
  const uint64_t len64 = len;
  f[0] = static_cast<char>(ControlKind::kP2pArenaChunk);
  h.Write(&f[1]);
  std::memcpy(&f[kArenaOffsetAt], &at, 8);
  std::memcpy(&f[kArenaOffsetAt + 8], &len64, 8);
  held_[static_cast<size_t>(peer)] += (len + kAlign - 1) / kAlign * kAlign;
  *sent = true;
  return transport_->SendControl(peer, f);
}

Status P2pArenaLane::Open(int peer, const std::string& frame, P2pChunkHeader* h, const char** bytes,
                          size_t* len, uint64_t* arena_offset) const {
  const P2pArenaView theirs = transport_->PeerP2pArena(peer);
  uint64_t len64 = 0;
  if (frame.size() == kChunkFrameBytes) {
    *h = P2pChunkHeader::Read(&frame[1]);
    std::memcpy(arena_offset, &frame[kArenaOffsetAt], 8);
    std::memcpy(&len64, &frame[kArenaOffsetAt + 8], 8);
  }
  if (frame.size() != kChunkFrameBytes || theirs.base == nullptr || *arena_offset > theirs.bytes ||
      len64 > theirs.bytes - *arena_offset) {
    return Status::Internal("corrupt point-to-point arena frame from rank " + std::to_string(peer));
  }
  *bytes = theirs.base + *arena_offset;
  *len = static_cast<size_t>(len64);
  return Status::OK();
}

Status P2pArenaLane::Release(int peer, uint64_t arena_offset) {
  std::string f(kFreeFrameBytes, '\0');
  f[0] = static_cast<char>(ControlKind::kP2pArenaFree);
  std::memcpy(&f[1], &arena_offset, 8);
  return transport_->SendControl(peer, f);
}

Status P2pArenaLane::OnFree(int peer, const std::string& frame) {
  uint64_t at = 0, bytes = 0;
  if (frame.size() == kFreeFrameBytes) std::memcpy(&at, &frame[1], 8);
  if (frame.size() != kFreeFrameBytes || !ring_.Free(at, peer, &bytes)) {
    return Status::Internal("point-to-point arena: rank " + std::to_string(peer) +
                            " freed a region it does not hold (offset " + std::to_string(at) + ")");
  }
  uint64_t& held = held_[static_cast<size_t>(peer)];
  held -= std::min(held, bytes);
  return Status::OK();
}

void P2pArenaLane::PeerLeft(int peer) {
  ring_.FreePeer(peer);
  held_[static_cast<size_t>(peer)] = 0;
}

}  // namespace hvdlite
