// Bootstrap: from the Config (launcher environment) to a connected job:
// rank/size, the local/cross topology, and the transport mesh (shared memory
// between ranks on the same host unless HVDLITE_SHM_DISABLE, TCP otherwise).
// Blocking, bounded by HVDLITE_START_TIMEOUT.
#pragma once
#include <memory>

#include "common/config.h"
#include "common/status.h"
#include "transport/transport.h"

namespace hvdlite {

struct Topology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
};

Status Bootstrap(const Config& cfg, Topology* topo, std::unique_ptr<Transport>* transport);

}  // namespace hvdlite
