// ReduceScatter: ring reduce-scatter over variable-size blocks, leaving the
// input untouched.
//
// Block i is counts[i] elements of `in`, in member order. Step s
// (0 <= s < size-1, tag tag + s): member m sends block b = (m - s - 1) and
// receives block (m - s - 2) from m-1. At step 0 it sends its own input block;
// later it sends the partial result it accumulated for that block in the step
// before. What it receives is reduced into a destination first set to its
// own input block, as op(own, received): at the last step that destination is
// `out` (block m, now fully reduced), before it one of two scratch block
// buffers (one is being sent while the other receives). So block b is reduced
// along one fixed chain of members (the same one as before: deterministic),
// the input is only read, and the only copies are one block per step. Empty
// blocks are skipped on both sides. Scratch: 2 blocks of thread-local memory
// (none for 2 members).
#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/ring.h"

namespace hvdlite {
namespace {

Status CheckArgs(const Group& g, const std::vector<int64_t>& counts, DataType dtype, ReduceOp op) {
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
  return Status::OK();
}

}  // namespace

Status ReduceScatter(const Group& g, const void* in, const std::vector<int64_t>& counts, void* out,
                     DataType dtype, ReduceOp op) {
  HVD_RETURN_IF_ERROR(CheckArgs(g, counts, dtype, op));
  const int p = g.size();
  const size_t es = DataTypeSize(dtype);
  const std::vector<alg::Range> blocks = alg::PrefixBlocks(counts);
  const char* input = static_cast<const char*>(in);
  auto block = [&](int b) { return input + blocks[b].offset * static_cast<int64_t>(es); };
  auto bytes = [&](int b) { return static_cast<size_t>(blocks[b].count) * es; };
  if (bytes(g.me) > 0) std::memcpy(out, block(g.me), bytes(g.me));
  if (p == 1) return Status::OK();
  size_t widest = 0;
  for (int b = 0; b < p; ++b) widest = std::max(widest, bytes(b));
  char* scratch = p > 2 ? alg::ThreadScratch(2 * widest) : nullptr;
  const int next = g.peer(alg::Mod(g.me + 1, p));
  const int prev = g.peer(alg::Mod(g.me - 1, p));
  const alg::ElementReducer reduce(dtype, op);
  const char* sending = nullptr;  // partial of the block sent next (null: the raw input block)
  for (int s = 0; s < p - 1; ++s) {
    const int sb = alg::Mod(g.me - s - 1, p);
    const int rb = alg::Mod(g.me - s - 2, p);
    char* dst = s == p - 2 ? static_cast<char*>(out) : scratch + (s % 2) * widest;
    if (dst != out && bytes(rb) > 0) std::memcpy(dst, block(rb), bytes(rb));
    const uint32_t tag = g.tag + static_cast<uint32_t>(s);
    if (bytes(sb) > 0 || bytes(rb) > 0) {
      Status st = g.transport->SendRecvReduce(bytes(sb) > 0 ? next : -1, tag, sending ? sending : block(sb),
                                              bytes(sb), bytes(rb) > 0 ? prev : -1, tag, dst, bytes(rb),
                                              reduce.reducer());
      if (!st.ok()) return st.WithContext("ReduceScatter step " + std::to_string(s));
    }
    sending = dst;
  }
  return Status::OK();
}

}  // namespace hvdlite
