// Group: the ranks one collective runs over, as a view onto a Transport.
// Member i of the group is global rank ranks[i]; this process is member `me`.
#pragma once
#include <cstdint>
#include <vector>

#include "transport/transport.h"

namespace hvdlite {

struct Group {
  Transport* transport = nullptr;
  std::vector<int> ranks;  // global ranks, ascending; ranks[me] == transport->rank()
  int me = 0;
  // Tag base for this collective; algorithms add small step numbers to it so a
  // message from the wrong step or collective is detected, not misread.
  uint32_t tag = 0;

  int size() const { return static_cast<int>(ranks.size()); }
  int peer(int member) const { return ranks[member]; }
};

}  // namespace hvdlite
