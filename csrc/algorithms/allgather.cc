// Allgatherv: ring over variable-size byte blocks.
//
// Member m first places its own block in its slot of `recv`, then for
// s = 0 .. size-2 sends block (m - s) to m+1 and receives block (m - s - 1)
// from m-1 directly into place (alg::RingAllgather, tags tag + s). Every
// member knows every block size, so a step whose blocks are both empty is
// skipped and an empty side sends nothing. No scratch memory.
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/ring.h"

namespace hvdlite {

Status Allgatherv(const Group& g, const void* send, void* recv, const std::vector<int64_t>& bytes) {
  HVD_RETURN_IF_ERROR(alg::CheckGroup(g, "Allgatherv"));
  if (static_cast<int>(bytes.size()) != g.size()) {
    return Status::InvalidArgument("Allgatherv: " + std::to_string(bytes.size()) +
                                   " block sizes for a group of " + std::to_string(g.size()));
  }
  for (int64_t b : bytes) {
    if (b < 0) return Status::InvalidArgument("Allgatherv: negative block size");
  }
  const std::vector<alg::Range> blocks = alg::PrefixBlocks(bytes);
  char* out = static_cast<char*>(recv);
  const alg::Range mine = blocks[g.me];
  if (mine.count > 0 && send != out + mine.offset) {
    std::memmove(out + mine.offset, send, static_cast<size_t>(mine.count));
  }
  return alg::RingAllgather(g, out, blocks, /*shift=*/0, g.tag).WithContext("Allgatherv");
}

}  // namespace hvdlite
