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

bool SaneGeometry(const Geometry& g) {
  auto ok = [](uint32_t n, uint64_t b) {
    return n >= 1 && n <= kMaxSlotsPerRing && b >= kLine && b % kLine == 0 && b <= kMaxSlotBytes;
  };
  return ok(g.ctrl_slots, g.ctrl_slot_bytes) && ok(g.data_slots, g.data_slot_bytes);
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
    linked_ = o.linked_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.linked_ = false;
  }
  return *this;
}

void Segment::Reset() {
  Unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

void Segment::Unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

Status Segment::Create(const std::string& name, const Geometry& g, uint32_t pairs, int owner,
                       const uint64_t nonce[2], Segment* out) {
  const size_t bytes = SegmentBytes(g, pairs);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return SysError("shm_open(create)", name, errno);
  Segment seg;
  seg.name_ = name;
  seg.linked_ = true;  // from here on, every exit path unlinks (Reset)
  seg.bytes_ = bytes;
  Status st;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    st = SysError("ftruncate", name, errno);
  } else {
    st = MapFd(fd, bytes, name, &seg.base_);
  }
  ::close(fd);
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
  Segment seg;
  seg.name_ = name;
  seg.bytes_ = static_cast<size_t>(sb.st_size);
  Status st = MapFd(fd, seg.bytes_, name, &seg.base_);
  ::close(fd);
  if (!st.ok()) return st;
  const SegmentHeader* h = seg.header();
  bool ok = h->magic == kMagic && h->version == kVersion && h->owner == owner && h->nonce[0] == nonce[0] &&
            h->nonce[1] == nonce[1] && SaneGeometry(h->geometry) &&
            SegmentBytes(h->geometry, h->pairs) == seg.bytes_;
  if (!ok)
    return Status::Internal("shared-memory segment " + name + " is not the one rank " +
                            std::to_string(owner) + " published (wrong header)");
  *out = std::move(seg);
  return Status::OK();
}

}  // namespace shm
}  // namespace hvdlite
