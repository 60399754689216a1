// The two-level allreduce of the ring backend (see ring_backend.cc), pipelined
// chunk by chunk so the cross-host link stays busy while the hosts' shared
// memory does the local phases.
#pragma once
#include <cstdint>

#include "algorithms/group.h"
#include "common/dtype.h"
#include "common/status.h"

namespace hvdlite {

// In-place allreduce of `count` elements of `buf` over local x cross members:
// `local` holds this rank's host (same size on every host) and `cross` the
// members with the same local index on every host. The buffer is cut into
// chunks; in tick t every rank reduce-scatters chunk t inside its host,
// allreduces its block of chunk t-1 across hosts and allgathers chunk t-2
// inside its host, the local and cross-host steps running together through
// Transport::SendRecvPair. Every block is reduced along one fixed chain and
// then copied, so the result is bitwise identical on every member.
// Blocking; inherits the transport's timeouts. Tags: local.tag + small numbers.
Status PipelinedHierarchicalAllreduce(const Group& local, const Group& cross, void* buf, int64_t count,
                                      DataType dtype, ReduceOp op, double postscale);

}  // namespace hvdlite
