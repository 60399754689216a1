// Shared-memory rings of the shm transport (private to csrc/transport).
//
// A channel carries messages one way between two processes that map the same
// memory: a single producer fills fixed-size slots, a single consumer empties
// them in order. Each slot holds one piece of a message (a message longer
// than a slot takes several consecutive slots), described by a SlotHeader.
//
// Memory of one channel (64-byte aligned, see ChannelBytes):
//   [head line][tail line][slot 0: SlotHeader | slot_bytes of payload][slot 1]...
// `head` (pieces published) is written only by the producer and `tail`
// (pieces consumed) only by the consumer, each on its own cache line, so the
// two sides never write the same line. The producer publishes a filled slot
// with a release store of head; the consumer reads head with acquire, uses
// the slot in place (copies or reduces out of it), then releases it with a
// release store of tail. Each side keeps a private copy of the other side's
// counter and rereads the shared one only when its copy says full / empty.
//
// Threading: one producer thread and one consumer thread (in any process).
// Nothing here blocks or allocates; waiting is the transport's business.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace hvdlite {
namespace shm {

constexpr size_t kLine = 64;

enum SlotKind : uint32_t { kDataPiece = 1, kControlPiece = 2 };

struct alignas(kLine) SlotHeader {
  uint32_t tag;      // data tag (0 for control)
  uint32_t kind;     // SlotKind
  uint64_t msg_len;  // bytes of the whole message
  uint64_t offset;   // of this piece within the message
  uint64_t len;      // bytes of this piece (0 only for an empty message)
};
static_assert(sizeof(SlotHeader) == kLine, "a slot header is one cache line");

struct ChannelCounters {
  alignas(kLine) std::atomic<uint64_t> head;
  alignas(kLine) std::atomic<uint64_t> tail;
};
static_assert(sizeof(ChannelCounters) == 2 * kLine, "head and tail on separate lines");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be address-free atomics");

inline size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Bytes of a channel with `slots` slots of `slot_bytes` (a multiple of kLine).
inline size_t ChannelBytes(uint32_t slots, size_t slot_bytes) {
  return sizeof(ChannelCounters) + size_t(slots) * (sizeof(SlotHeader) + slot_bytes);
}

// Geometry of one channel inside a mapped segment.
struct ChannelView {
  ChannelCounters* counters = nullptr;
  char* slots = nullptr;
  uint32_t nslots = 0;
  size_t slot_bytes = 0;

  ChannelView() = default;
  ChannelView(char* base, uint32_t n, size_t bytes)
      : counters(reinterpret_cast<ChannelCounters*>(base)),
        slots(base + sizeof(ChannelCounters)),
        nslots(n),
        slot_bytes(bytes) {}
  SlotHeader* header(uint64_t seq) const {
    return reinterpret_cast<SlotHeader*>(slots + (seq % nslots) * (sizeof(SlotHeader) + slot_bytes));
  }
  char* payload(uint64_t seq) const { return reinterpret_cast<char*>(header(seq)) + sizeof(SlotHeader); }
};

class Producer {
 public:
  Producer() = default;
  explicit Producer(ChannelView v) : v_(v) {}
  bool attached() const { return v_.counters != nullptr; }
  size_t slot_bytes() const { return v_.slot_bytes; }

  // The next free slot (header and payload to fill), or nullptr when full.
  SlotHeader* Acquire(char** payload) {
    if (head_ - tail_seen_ >= v_.nslots) {
      tail_seen_ = v_.counters->tail.load(std::memory_order_acquire);
      if (head_ - tail_seen_ >= v_.nslots) return nullptr;
    }
    *payload = v_.payload(head_);
    return v_.header(head_);
  }
  // Makes the slot from Acquire visible to the consumer.
  void Publish() { v_.counters->head.store(++head_, std::memory_order_release); }

 private:
  ChannelView v_;
  uint64_t head_ = 0;       // this side's head (the shared one mirrors it)
  uint64_t tail_seen_ = 0;  // last tail read from shared memory
};

class Consumer {
 public:
  Consumer() = default;
  explicit Consumer(ChannelView v) : v_(v) {}
  bool attached() const { return v_.counters != nullptr; }

  // The oldest unconsumed slot, or nullptr when the ring is empty. The slot
  // stays valid (the producer will not touch it) until Release().
  const SlotHeader* Peek(const char** payload) {
    if (tail_ == head_seen_) {
      head_seen_ = v_.counters->head.load(std::memory_order_acquire);
      if (tail_ == head_seen_) return nullptr;
    }
    *payload = v_.payload(tail_);
    return v_.header(tail_);
  }
  // True when Peek would find a slot (reads shared memory only when needed).
  bool Ready() {
    if (tail_ != head_seen_) return true;
    head_seen_ = v_.counters->head.load(std::memory_order_acquire);
    return tail_ != head_seen_;
  }
  // Hands the slot from Peek back to the producer.
  void Release() { v_.counters->tail.store(++tail_, std::memory_order_release); }

 private:
  ChannelView v_;
  uint64_t tail_ = 0;
  uint64_t head_seen_ = 0;
};

}  // namespace shm
}  // namespace hvdlite
