#include "coordinator/relay.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "coordinator/messages.h"
#include "coordinator/steady_state.h"

namespace hvdlite {

NegotiationRelay::NegotiationRelay(int rank, int size)
    : rank_(rank),
      size_(size),
      parent_(rank == 0 ? -1 : VoteTree::Parent(rank)),
      children_(VoteTree::Children(rank, size)),
      queued_(children_.size() + 1) {}

// Appends [lo, hi) -> payload to q, merged into a queued run of the same
// payload that it extends on either side. Going up, entries of different
// ranks may be reordered but those of one rank may not (a rank's lists are
// taken in the order it sent them): the run merged into must be followed by
// no entry that shares a rank with [lo, hi). The search looks at the last
// kMergeWindow entries only, so queueing stays O(1).
void NegotiationRelay::Append(std::vector<Entry>* q, int lo, int hi, std::string payload) {
  constexpr size_t kMergeWindow = 8;
  for (size_t k = 0; k < q->size() && k < kMergeWindow; ++k) {
    Entry& e = (*q)[q->size() - 1 - k];
    if ((e.hi == lo || e.lo == hi) && e.payload == payload) {
      e.lo = std::min(e.lo, lo);
      e.hi = std::max(e.hi, hi);
      return;
    }
    if (e.lo < hi && lo < e.hi) break;  // shares a rank: stay behind it
  }
  q->push_back(Entry{lo, hi, std::move(payload)});
}

void NegotiationRelay::Queue(int peer, int lo, int hi, std::string payload) {
  size_t slot = 0;
  if (peer != parent_) slot = 1 + (std::find(children_.begin(), children_.end(), peer) - children_.begin());
  Append(&queued_[slot], lo, hi, std::move(payload));
}

void NegotiationRelay::Up(int from, std::string payload, std::vector<Delivery>* mine) {
  if (rank_ == 0) {
    mine->push_back(Delivery{from, from + 1, std::move(payload)});
    return;
  }
  Queue(parent_, from, from + 1, std::move(payload));
}

void NegotiationRelay::Down(int lo, int hi, const std::string& payload, std::vector<Delivery>* mine) {
  if (lo <= rank_ && rank_ < hi) mine->push_back(Delivery{rank_, rank_ + 1, payload});
  for (int c : children_) {
    const int clo = std::max(lo, c), chi = std::min(hi, VoteTree::SubtreeEnd(c, size_));
    if (clo < chi) Queue(c, clo, chi, payload);
  }
}

Status NegotiationRelay::OnMessage(int peer, const std::string& wire, std::vector<Delivery>* mine) {
  const Status corrupt = Status::Internal("corrupt relay message from rank " + std::to_string(peer));
  if (wire.size() < 5 || PeekControlKind(wire) != ControlKind::kRelay) return corrupt;
  uint32_t count = 0;
  std::memcpy(&count, wire.data() + 1, 4);
  size_t at = 5;
  const bool from_parent = peer == parent_;
  std::vector<Entry> up;  // rank 0: this message's runs, merged, then delivered
  for (uint32_t i = 0; i < count; ++i) {
    if (wire.size() < at + 12) return corrupt;
    int32_t lo = 0, hi = 0;
    uint32_t len = 0;
    std::memcpy(&lo, wire.data() + at, 4);
    std::memcpy(&hi, wire.data() + at + 4, 4);
    std::memcpy(&len, wire.data() + at + 8, 4);
    at += 12;
    if (wire.size() < at + len || lo < 0 || hi > size_ || lo >= hi) return corrupt;
    std::string payload = wire.substr(at, len);
    at += len;
    if (from_parent) {
      Down(lo, hi, payload, mine);
    } else if (rank_ == 0) {
      Append(&up, lo, hi, std::move(payload));
    } else {
      Queue(parent_, lo, hi, std::move(payload));
    }
  }
  for (Entry& e : up) mine->push_back(Delivery{e.lo, e.hi, std::move(e.payload)});
  return at == wire.size() ? Status::OK() : corrupt;
}

bool NegotiationRelay::HasOutgoing() const {
  for (const auto& q : queued_) {
    if (!q.empty()) return true;
  }
  return false;
}

void NegotiationRelay::TakeOutgoing(std::vector<Outgoing>* out) {
  out->clear();
  for (size_t slot = 0; slot < queued_.size(); ++slot) {
    std::vector<Entry>& q = queued_[slot];
    if (q.empty()) continue;
    size_t bytes = 5;
    for (const Entry& e : q) bytes += 12 + e.payload.size();
    std::string wire(bytes, '\0');
    wire[0] = static_cast<char>(ControlKind::kRelay);
    const uint32_t count = static_cast<uint32_t>(q.size());
    std::memcpy(&wire[1], &count, 4);
    size_t at = 5;
    for (const Entry& e : q) {
      const int32_t lo = e.lo, hi = e.hi;
      const uint32_t len = static_cast<uint32_t>(e.payload.size());
      std::memcpy(&wire[at], &lo, 4);
      std::memcpy(&wire[at + 4], &hi, 4);
      std::memcpy(&wire[at + 8], &len, 4);
      if (len) std::memcpy(&wire[at + 12], e.payload.data(), len);
      at += 12 + len;
    }
    q.clear();
    out->push_back(Outgoing{slot == 0 ? parent_ : children_[slot - 1], std::move(wire)});
  }
}

}  // namespace hvdlite
