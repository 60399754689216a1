// ReduceScatter: ring reduce-scatter over variable-size blocks.
//
// Block i is counts[i] elements of `buf`, in member order. Step s
// (0 <= s < size-1, tag tag + s): member m sends block (m - s - 1) to m+1 and
// receives block (m - s - 2) from m-1, reducing it into its copy as
// op(own, received) (alg::RingReduceScatter with shift -1, pieces of
// kPieceBytes received into thread-local scratch). After the last step member
// m holds block m fully reduced, which is copied to `out`. Empty blocks are
// skipped on both sides. Scratch: one piece (256 KiB) of thread-local memory.
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/ring.h"

namespace hvdlite {

Status ReduceScatter(const Group& g, void* buf, const std::vector<int64_t>& counts, void* out,
                     DataType dtype, ReduceOp op) {
  HVD_RETURN_IF_ERROR(alg::CheckGroup(g, "ReduceScatter"));
  if (dtype == DataType::kBool || DataTypeSize(dtype) == 0) {
    return Status::NotSupported(std::string("reducescatter of dtype ") + DataTypeName(dtype));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax && op != ReduceOp::kProduct) {
    return Status::NotSupported(std::string("reducescatter with op ") + ReduceOpName(op));
  }
  if (static_cast<int>(counts.size()) != g.size()) {
    return Status::InvalidArgument("ReduceScatter: " + std::to_string(counts.size()) +
                                   " block counts for a group of " + std::to_string(g.size()));
  }
  for (int64_t c : counts) {
    if (c < 0) return Status::InvalidArgument("ReduceScatter: negative block count");
  }
  const std::vector<alg::Range> blocks = alg::PrefixBlocks(counts);
  char* data = static_cast<char*>(buf);
  Status st = alg::RingReduceScatter(g, data, blocks, dtype, op, /*shift=*/-1, g.tag);
  if (!st.ok()) return st.WithContext("ReduceScatter");
  const size_t es = DataTypeSize(dtype);
  const alg::Range mine = blocks[g.me];
  char* src = data + mine.offset * static_cast<int64_t>(es);
  if (mine.count > 0 && src != out) std::memmove(out, src, static_cast<size_t>(mine.count) * es);
  return Status::OK();
}

}  // namespace hvdlite
