// NegotiationRelay: negotiation travels the vote tree (VoteTree, rooted at
// rank 0) instead of a connection from every rank to rank 0. A rank sends its
// RequestList to its tree parent; each parent forwards what its subtree sent
// in one message per engine turn; rank 0's ResponseLists come back down, one
// message per child, each rank keeping its own and passing the rest on. So
// rank 0 talks to log2(n) children instead of n-1 ranks, and every rank to at
// most log2(n) + 1 peers for negotiation and steady-state votes together.
//
// Going up, runs merge the same way: ranks whose lists are equal bytes (every
// rank hitting the same cached tensors, the steady negotiation of a training
// loop) reach rank 0 as one entry, and its coordinator takes them as a range
// (Coordinator::Add), so rank 0 parses O(children) lists per cycle, not N.
//
// Wire (ControlKind::kRelay): kind, entry count (u32), then per entry: first
// rank (i32), one past the last rank (i32), payload length (u32), payload (a
// serialized RequestList going up, ResponseList going down). Going down, one
// entry serves a run of consecutive ranks with the same payload (the usual
// case: every rank of the global set gets the same responses), so rank 0
// sends each list's bytes once per child, not once per rank.
//
// Pure logic: messages in, an outbox out (the runtime or the simulation moves
// them). Threading: single-threaded (the engine holder).
#pragma once
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

class NegotiationRelay {
 public:
  // A payload for this rank: from ranks [rank, hi) (up: a run of ranks that
  // sent the same bytes), or for this rank (down: hi = rank + 1).
  struct Delivery {
    int rank;
    int hi;
    std::string payload;
  };
  struct Outgoing {
    int peer;
    std::string wire;
  };
  NegotiationRelay(int rank, int size);
  int parent() const { return parent_; }  // -1 on rank 0
  // A RequestList (serialized) of rank `from` on its way to rank 0: rank 0
  // delivers it to itself (*mine), the others queue it for their parent.
  void Up(int from, std::string payload, std::vector<Delivery>* mine);
  // Rank 0: a ResponseList (serialized) for every rank in [lo, hi).
  void Down(int lo, int hi, const std::string& payload, std::vector<Delivery>* mine);
  // A relay message from `peer`: what is for this rank goes to *mine (up at
  // rank 0: the requests of each sender; down: this rank's responses), the
  // rest is queued for the parent or the children. Internal on a corrupt message.
  Status OnMessage(int peer, const std::string& wire, std::vector<Delivery>* mine);
  bool HasOutgoing() const;
  // One message per peer with what was queued for it (in order). Swaps with *out.
  void TakeOutgoing(std::vector<Outgoing>* out);

 private:
  struct Entry {
    int lo, hi;
    std::string payload;
  };
  void Queue(int peer, int lo, int hi, std::string payload);
  static void Append(std::vector<Entry>* q, int lo, int hi, std::string payload);
  int rank_, size_, parent_;
  std::vector<int> children_;
  std::vector<std::vector<Entry>> queued_;  // per peer index: 0 = parent, 1 + i = children_[i]
};

}  // namespace hvdlite
