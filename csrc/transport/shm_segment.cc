// POSIX shared-memory segments (see shm_segment.h).
#include "transport/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/socket_util.h"

namespace hvdlite {
namespace shm {
namespace {

Status SysError(const std::string& what, const std::string& name, int err) {
  return Status::Internal(what + " of shared-memory segment " + name + " failed: " + net::ErrnoString(err));
}

// Maps fd (bytes long) shared, read-write, every page populated.
Status MapFd(int fd, size_t bytes, const std::string& name, char** out) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return SysError("mmap", name, errno);
  *out = static_cast<char*>(p);
  return Status::OK();
}

// Bounds on a ring's geometry as read from a peer's segment header (it is
// checked because the header is memory another process wrote): slots per ring,
// not ranks. The number of ranks on a host has no fixed limit here.
constexpr uint32_t kMaxSlotsPerRing = 4096;
constexpr uint64_t kMaxSlotBytes = 1ull << 30;
constexpr uint64_t kMaxArenaBytes = 1ull << 40;

bool SaneGeometry(const Geometry& g) {
  auto ok = [](uint32_t n, uint64_t b) {
    return n >= 1 && n <= kMaxSlotsPerRing && b >= kLine && b % kLine == 0 && b <= kMaxSlotBytes;
  };
  return ok(g.ctrl_slots, g.ctrl_slot_bytes) && ok(g.data_slots, g.data_slot_bytes) &&
         g.arena_bytes <= kMaxArenaBytes && g.arena_bytes % kArenaAlign == 0;
}

}  // namespace

Geometry MakeGeometry(size_t channel_bytes) {
  Geometry g;
  const size_t slot = std::max<size_t>(4 << 10, channel_bytes / g.data_slots);
  g.data_slot_bytes = RoundUp(slot, kLine);
  return g;
}

ChannelView ControlChannel(char* base, const Geometry& g, uint32_t k) {
  return ChannelView(base + HeaderBytes() + k * g.PairBytes(), g.ctrl_slots, g.ctrl_slot_bytes);
}

ChannelView DataChannel(char* base, const Geometry& g, uint32_t k) {
  char* pair = base + HeaderBytes() + k * g.PairBytes();
  return ChannelView(pair + ChannelBytes(g.ctrl_slots, g.ctrl_slot_bytes), g.data_slots, g.data_slot_bytes);
}

Segment::~Segment() { Reset(); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    Reset();
    name_ = std::move(o.name_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    arena_ = o.arena_;
    arena_bytes_ = o.arena_bytes_;
    reserved_ = o.reserved_;
    fd_ = o.fd_;
    linked_ = o.linked_;
    o.base_ = o.arena_ = nullptr;
    o.bytes_ = o.arena_bytes_ = o.reserved_ = 0;
    o.fd_ = -1;
    o.linked_ = false;
  }
  return *this;
}

void Segment::Reset() {
  Unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (arena_ != nullptr) ::munmap(arena_, arena_bytes_);
  if (fd_ >= 0) ::close(fd_);
  base_ = arena_ = nullptr;
  bytes_ = arena_bytes_ = reserved_ = 0;
  fd_ = -1;
}

// The arena: its own mapping, at its offset, with no page populated.
Status Segment::MapArena(int fd, const std::string& name) {
  if (arena_bytes_ == 0) return Status::OK();
  void* p = ::mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(bytes_));
  if (p == MAP_FAILED) return SysError("mmap (arena)", name, errno);
  arena_ = static_cast<char*>(p);
  return Status::OK();
}

Status Segment::ReserveArena(size_t bytes) {
  if (bytes <= reserved_) return Status::OK();
  if (fd_ < 0 || bytes > arena_bytes_)
    return Status::Internal("point-to-point arena: reserving " + std::to_string(bytes) + " of " +
                            std::to_string(arena_bytes_) + " bytes");
  const off_t at = static_cast<off_t>(bytes_ + reserved_);
  if (::fallocate(fd_, 0, at, static_cast<off_t>(bytes - reserved_)) != 0) {
    return Status::Precondition("backing " + std::to_string(bytes) +
                                " bytes of the point-to-point arena in /dev/shm failed (" +
                                net::ErrnoString(errno) + "): /dev/shm is full or too small");
  }
  reserved_ = bytes;
  return Status::OK();
}

void Segment::Unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

Status Segment::Create(const std::string& name, const Geometry& g, uint32_t pairs, int owner,
                       const uint64_t nonce[2], Segment* out) {
  const size_t bytes = RingsBytes(g, pairs);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return SysError("shm_open(create)", name, errno);
  Segment seg;
  seg.name_ = name;
  seg.linked_ = true;  // from here on, every exit path unlinks (Reset)
  seg.bytes_ = bytes;
  seg.arena_bytes_ = g.arena_bytes;
  seg.fd_ = fd;  // closed by Reset, on every path
  Status st;
  if (::ftruncate(fd, static_cast<off_t>(bytes + g.arena_bytes)) != 0) {
    st = SysError("ftruncate", name, errno);
  } else {
    st = MapFd(fd, bytes, name, &seg.base_);
  }
  if (st.ok()) st = seg.MapArena(fd, name);
  if (!st.ok()) return st;  // seg's destructor unlinks
  SegmentHeader* h = seg.header();
  h->magic = kMagic;
  h->version = kVersion;
  h->owner = owner;
  h->nonce[0] = nonce[0];
  h->nonce[1] = nonce[1];
  h->pairs = pairs;
  h->geometry = g;
  h->sleeping.store(0);
  *out = std::move(seg);
  return Status::OK();
}

Status Segment::Open(const std::string& name, int owner, const uint64_t nonce[2], Segment* out) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return SysError("shm_open", name, errno);
  struct stat sb;
  if (::fstat(fd, &sb) != 0 || sb.st_size < static_cast<off_t>(HeaderBytes())) {
    int err = errno;
    ::close(fd);
    return SysError("fstat", name, err ? err : EINVAL);
  }
  // The header first (one page), to learn where the rings end.
  const size_t file_bytes = static_cast<size_t>(sb.st_size);
  Segment seg;
  seg.name_ = name;
  seg.bytes_ = HeaderBytes();
  Status st = MapFd(fd, seg.bytes_, name, &seg.base_);
  bool ok = false;
  if (st.ok()) {
    const SegmentHeader* h = seg.header();
    ok = h->magic == kMagic && h->version == kVersion && h->owner == owner && h->nonce[0] == nonce[0] &&
         h->nonce[1] == nonce[1] && SaneGeometry(h->geometry) &&
         SegmentBytes(h->geometry, h->pairs) == file_bytes;
  }
  if (st.ok() && ok) {
    const Geometry g = seg.header()->geometry;
    const size_t rings = RingsBytes(g, seg.header()->pairs);
    ::munmap(seg.base_, seg.bytes_);
    seg.base_ = nullptr;
    seg.bytes_ = rings;
    seg.arena_bytes_ = g.arena_bytes;
    st = MapFd(fd, rings, name, &seg.base_);
    if (st.ok()) st = seg.MapArena(fd, name);
  }
  ::close(fd);
  if (!st.ok()) return st;
  if (!ok)
    return Status::Internal("shared-memory segment " + name + " is not the one rank " +
                            std::to_string(owner) + " published (wrong header)");
  *out = std::move(seg);
  return Status::OK();
}

}  // namespace shm
}  // namespace hvdlite
