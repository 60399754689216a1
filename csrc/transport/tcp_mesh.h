// Builds the authenticated full TCP mesh used by TcpTransport (private).
#pragma once
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

class Store;

// On success (*fds)[p] is a connected, authenticated, nonblocking socket to
// rank p (and -1 for p == rank). Listens on advertise_host:0, publishes
// "<prefix>addr/<rank>", connects to every lower rank and accepts every higher
// rank (on a helper thread, poll-based, so strangers never block it); the
// listener is closed before returning. Everything is bounded by connect_timeout_s.
Status BuildTcpMesh(Store* store, const std::string& prefix, int rank, int size,
                    const std::string& advertise_host, const std::string& secret, double connect_timeout_s,
                    std::vector<int>* fds);

}  // namespace hvdlite
