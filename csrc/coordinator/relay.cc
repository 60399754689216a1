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

void NegotiationRelay::Queue(int peer, int lo, int hi, std::string payload) {
  size_t slot = 0;
  if (peer != parent_) slot = 1 + (std::find(children_.begin(), children_.end(), peer) - children_.begin());
  std::vector<Entry>& q = queued_[slot];
  if (!q.empty() && q.back().hi == lo && q.back().payload == payload) {
    q.back().hi = hi;  // a run of ranks with the same payload
    return;
  }
  q.push_back(Entry{lo, hi, std::move(payload)});
}

void NegotiationRelay::Up(int from, std::string payload, std::vector<Delivery>* mine) {
  if (rank_ == 0) {
    mine->push_back(Delivery{from, std::move(payload)});
    return;
  }
  Queue(parent_, from, from + 1, std::move(payload));
}

void NegotiationRelay::Down(int lo, int hi, const std::string& payload, std::vector<Delivery>* mine) {
  if (lo <= rank_ && rank_ < hi) mine->push_back(Delivery{rank_, payload});
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
    } else {
      for (int r = lo; r < hi; ++r) Up(r, payload, mine);
    }
  }
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
