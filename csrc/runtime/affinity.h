// Pinning ranks to cores when they exactly fill a host (HVDLITE_PIN_CORES).
#pragma once
#include "runtime/bootstrap.h"

namespace hvdlite {

// When more than one rank shares this host and the ranks on it are exactly
// as many as the CPUs this process may run on, pins every thread of this
// process to the local_rank-th of those CPUs, as Open MPI binds ranks to cores.
// Unpinned, two ranks that take turns sleeping and waking each other can stay
// stacked on one core while the other idles (a waker's CPU is where the
// kernel puts the thread it wakes). Does nothing otherwise, or when the
// process was already restricted to fewer CPUs. Best effort: failures are
// logged at debug level. Call once, from init, before starting threads.
void PinToCoreIfHostIsFull(const Topology& topo);

}  // namespace hvdlite
