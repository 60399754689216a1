// Who takes part in one collective, declared once: the runtime fills a
// CollectiveContext per operation, backends receive it, and the algorithms
// see it, with the Transport to run over, as a Group.
// Member i of a collective is global rank ranks[i]; this process is member `me`.
#pragma once
#include <cstdint>
#include <vector>

#include "transport/transport.h"

namespace hvdlite {

struct CollectiveContext {
  int32_t process_set = 0;
  std::vector<int> ranks;  // global ranks, ascending
  int me = 0;              // this process's index in `ranks`
  // Tag base, unique per collective (wraps); algorithms add small step numbers
  // to it so a message from the wrong step or collective is detected, not misread.
  uint32_t tag = 0;

  int size() const { return static_cast<int>(ranks.size()); }
  int peer(int member) const { return ranks[member]; }
};

// A collective's members as a view onto a Transport (ranks[me] == transport->rank()).
struct Group : CollectiveContext {
  Transport* transport = nullptr;

  Group() = default;
  Group(const CollectiveContext& ctx, Transport* t) : CollectiveContext(ctx), transport(t) {}
};

}  // namespace hvdlite
