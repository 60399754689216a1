// The `auto` CPU backend: per collective, the byte range in which MPI runs it
// instead of the ring. Used by the registry; a header of its own so that the
// choice can be tested without MPI.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <memory>

#include "backend/backend.h"

namespace hvdlite {

// [from, below) in bytes of the whole message (allgather: all members' bytes;
// reducescatter: the whole input). An empty range (from >= below) means never.
struct ByteRange {
  int64_t from = 0;
  int64_t below = 0;
};
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

struct AutoTable {
  // Indexed by Collective. Alltoall, whose sizes differ between members, goes
  // to MPI for every size when its range is non-empty, to the ring otherwise.
  std::array<ByteRange, 5> mpi{};
  constexpr bool UsesMpi(Collective c, int64_t bytes) const {
    const ByteRange& r = mpi[static_cast<size_t>(c)];
    return c == Collective::kAlltoall ? r.from < r.below : (bytes >= r.from && bytes < r.below);
  }
  // False when every range is empty: auto is then the ring alone.
  constexpr bool AnyMpi() const {
    for (const ByteRange& r : mpi)
      if (r.from < r.below) return true;
    return false;
  }
};

// The table `auto` uses, from benchmarks/_mpi_path.py (mpirun -n 2 --oversubscribe
// --bind-to none, 2-core VM, float32, in place, one compute thread per rank,
// median of 10, ring over the shared-memory transport), four runs on
// 2026-11-24 on a machine shared with other developers. CPU used by others
// during the ring / mpi halves: run 1 0% / 20%, run 2 2% / 21%, run 3 23% / 24%,
// run 4 32% / 31% (two more runs at 47-68% were discarded).
// Ring time / MPI time per run (below 1: the ring is faster; "-": not measured):
//
//  size    allreduce         allgather          broadcast         alltoall        reducescatter
//  4 KiB   .90 .83 .90 1.00  .86 .78 .92 .78    .78 .81 .84 .82   - .85 .91 .90   - .88 .96 .88
//  64 KiB  .74 .69 .76 .74   .71 .70 .73 .76    .80 .75 .77 .88   - 1.66 .75 .80  - .63 .68 .72
//  256 KiB .69 .72 .92 .78   .68 .68 .74 .40    .77 .92 .96 .96   - 1.25 .81 .81  - .67 .34 .35
//  1 MiB   .65 .89 .66 .65   .66 .97 .67 .49    1.37 .95 .95 1.59 - .93 .93 .76   - .62 .51 .68
//  4 MiB   .69 1.07 .75 .82  1.24 1.22 1.07 .89 1.62 .53 .87 1.93 - .73 .83 1.23  - .14 .46 .45
//  16 MiB  .80 .95 1.20 1.45 .98 .96 1.08 1.19  1.14 1.07 .75 .98 - .99 1.03 1.21 - .08 .17 .25
//  64 MiB  .13 .24 .77 .12   .71 1.23 1.44 1.35 .97 .86 .92 .88   - 1.01 1.69 .48 - .05 .09 .05
//
// Medians of run 2, ring / MPI: allreduce 64 KiB 37.5 / 54.8 us, 64 MiB
// 7.28 / 30.4 ms; reducescatter 16 MiB 1.35 / 17.3 ms; allgather 4 MiB
// 284 / 233 us; broadcast 1 MiB 75.0 / 79.2 us.
//
// Rule: MPI takes a range only where it was faster in every run. It was in
// none: the ring is ahead or within run-to-run noise for every collective and
// size (the old split, MPI from 64 KiB, predates the shared-memory transport
// and made allreduce up to 8x and reducescatter up to 20x slower). So `auto`
// runs everything on the ring; measure again (and fill a range) where MPI has
// a faster path, e.g. across hosts on an interconnect the ring's TCP cannot use.
constexpr AutoTable kMeasuredAutoTable{};

std::unique_ptr<Backend> NewSplitBackend(std::unique_ptr<Backend> ring, std::unique_ptr<Backend> mpi,
                                         const AutoTable& table);

}  // namespace hvdlite
