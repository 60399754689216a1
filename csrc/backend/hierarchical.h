// The two-level allreduce of the ring backend (see ring_backend.cc), pipelined
// chunk by chunk so the cross-host link stays busy while the hosts' shared
// memory does the local phases; and the two-level allgatherv.
#pragma once
#include <cstdint>
#include <vector>

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

// Allgatherv over local x cross members where the flat group's member i is
// member i % L of host i / L (hosts hold consecutive members, L each; `local`
// is this rank's host, `cross` the members with its local index, ordered by
// host). Same contract as Allgatherv (algorithms.h): `bytes` per flat member,
// member i's block at sum(bytes[0..i)) of `recv`, `send` may alias it. Steps:
// allgather inside the host, so every member holds its host's blocks; each
// cross group allgathers its 1/L piece of every host's (contiguous) bytes; every
// host allgathers, per remote host, the pieces its members received. Only
// copies, so the result is bitwise that of the flat ring. Blocking; inherits
// the transport's timeouts. Tags: local.tag + up to L + H + H*L.
Status HierarchicalAllgatherv(const Group& local, const Group& cross, const void* send, void* recv,
                              const std::vector<int64_t>& bytes);

}  // namespace hvdlite
