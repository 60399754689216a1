#include "runtime/executor.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/reduce_kernels.h"
#include "common/logging.h"

namespace hvdlite {
namespace {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Elements in one row (everything but the first dimension); a scalar is one row of one.
int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

size_t TensorBytes(const TensorEntry& e) {
  return static_cast<size_t>(NumElements(e.request.shape)) * DataTypeSize(e.request.dtype);
}

const TensorEntry& Ref(const TensorEntry& e) { return e; }
const TensorEntry& Ref(const TensorEntry* e) { return *e; }

// The fusion buffer's layout: the tensors of `entries` (TensorEntry values or
// pointers) back to back, in order.
template <class Entries>
void PackTensors(const Entries& entries, char* out) {
  for (const auto& item : entries) {
    const TensorEntry& e = Ref(item);
    const size_t n = TensorBytes(e);
    if (n) std::memcpy(out, e.data, n);
    out += n;
  }
}

template <class Entries>
void UnpackTensors(const char* in, const Entries& entries) {
  for (const auto& item : entries) {
    const TensorEntry& e = Ref(item);
    const size_t n = TensorBytes(e);
    if (n) std::memcpy(e.data, in, n);
    in += n;
  }
}

// What a backend applies for request `r` over `set_size` members: Sum and
// Min/Max/Product reduce as themselves; Average reduces as Sum and divides
// afterwards (a postscale of 1/size on top of the caller's).
Reduction ReductionOf(const Request& r, int set_size) {
  Reduction red;
  red.dtype = r.dtype;
  red.op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  red.prescale = r.prescale;
  red.postscale = r.op == ReduceOp::kAverage ? r.postscale / set_size : r.postscale;
  return red;
}

}  // namespace

Executor::Executor(int rank, Backend* backend, ProcessSetTable* sets, HandleTable* handles,
                   TensorQueue* queue, LocalRequestCache* cache, Timeline* timeline)
    : rank_(rank),
      backend_(backend),
      sets_(sets),
      handles_(handles),
      queue_(queue),
      cache_(cache),
      timeline_(timeline) {}

void Executor::TraceBegin(const std::vector<TensorEntry>& entries, const std::string& phase) {
  if (timeline_ == nullptr || !timeline_->Active()) return;
  for (const auto& e : entries) timeline_->Begin(e.request.name, phase);
}

void Executor::TraceEnd(const std::vector<TensorEntry>& entries, const std::string& phase,
                        const std::string& args) {
  if (timeline_ == nullptr || !timeline_->Active()) return;
  for (const auto& e : entries) timeline_->End(e.request.name, phase, args);
}

// Timeline args of one collective: backend/algorithm, bytes, fused tensors.
std::string Executor::Describe(const Response& r, const std::vector<TensorEntry>& entries) {
  static const std::map<OpType, Collective> kinds = {{OpType::kAllreduce, Collective::kAllreduce},
                                                     {OpType::kAllgather, Collective::kAllgather},
                                                     {OpType::kBroadcast, Collective::kBroadcast},
                                                     {OpType::kAlltoall, Collective::kAlltoall},
                                                     {OpType::kReducescatter, Collective::kReducescatter}};
  int64_t bytes = 0;
  for (const auto& e : entries)
    bytes += NumElements(e.request.shape) * static_cast<int64_t>(DataTypeSize(e.request.dtype));
  auto kind = kinds.find(r.type);
  std::string algorithm =
      kind == kinds.end()
          ? "none"
          : backend_->Describe(kind->second, bytes, static_cast<int>(sets_->Ranks(r.process_set).size()));
  return "\"algorithm\": " + JsonString(algorithm) + ", \"bytes\": " + std::to_string(bytes) +
         ", \"tensors\": " + std::to_string(entries.size());
}

CollectiveContext Executor::Context(int32_t process_set) {
  CollectiveContext ctx;
  ctx.process_set = process_set;
  ctx.ranks = sets_->Ranks(process_set);
  auto me = std::lower_bound(ctx.ranks.begin(), ctx.ranks.end(), rank_);  // (ascending: Ranks())
  ctx.me = me != ctx.ranks.end() && *me == rank_ ? static_cast<int>(me - ctx.ranks.begin()) : -1;
  ctx.tag = (sequence_[process_set]++ & 0xFFFFu) << 16;
  return ctx;
}

void* Executor::Scratch(int64_t bytes) {
  if (fusion_buffer_.size() < static_cast<size_t>(bytes)) fusion_buffer_.resize(bytes);
  return fusion_buffer_.data();
}

// A rank inside join() runs the collectives the others still submit, with a
// stand-in buffer holding the reduction's identity (handle 0: nobody waits).
TensorEntry Executor::StandIn(const Request& spec) {
  TensorEntry e;
  e.request = spec;
  e.request.rank = rank_;
  const int64_t count = NumElements(spec.shape);
  stand_in_buffers_.emplace_back(static_cast<size_t>(std::max<int64_t>(1, count)) * DataTypeSize(spec.dtype));
  e.data = stand_in_buffers_.back().data();
  if (spec.type == OpType::kAllreduce) FillIdentity(e.data, count, spec.dtype, spec.op);
  return e;
}

Status Executor::ExecuteScheduled(const Response& response, const std::vector<const char*>* voted_inputs) {
  stats_.scheduled_responses.fetch_add(1, std::memory_order_relaxed);
  voted_inputs_ = voted_inputs;
  Status st = Execute(response, /*remember=*/false);
  voted_inputs_ = nullptr;
  return st;
}

Status Executor::Execute(const Response& response, bool remember) {
  std::vector<TensorEntry>& entries = entries_;  // reused: no allocation per response
  entries.clear();
  stand_in_buffers_.clear();
  for (size_t i = 0; i < response.names.size(); ++i) {
    TensorEntry e;
    if (queue_->Pop(response.process_set, response.names[i], &e)) {
      entries.push_back(std::move(e));
      if (remember && response.error_code == StatusCode::kOk && i < response.cache_ids.size()) {
        cache_->Remember(entries.back().request, response.cache_ids[i]);
      }
    } else if (response.error_code == StatusCode::kOk && i < response.specs.size()) {
      entries.push_back(StandIn(response.specs[i]));
    } else if (response.error_code == StatusCode::kOk) {
      return Status::Internal("coordinator scheduled tensor '" + response.names[i] +
                              "' that this rank never submitted");
    }
  }
  if (response.error_code != StatusCode::kOk) {
    for (auto& e : entries) {
      HandleResult r;
      r.status = Status(response.error_code, response.error);
      queue_->Finish(e.request.process_set, e.request.name);
      handles_->Complete(e.handle, std::move(r));
    }
    return Status::OK();
  }
  HandleResult result;
  const bool tracing = timeline_ != nullptr && timeline_->Active();
  std::string phase;
  if (tracing) {
    phase = OpTypeName(response.type);
    for (auto& ch : phase) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    TraceBegin(entries, phase);
  }
  Status st = Run(response, entries, &result);
  if (st.ok() && response.type == OpType::kAllreduce) {
    stats_.allreduce_responses.fetch_add(1, std::memory_order_relaxed);
    stats_.allreduce_tensors.fetch_add(static_cast<int64_t>(entries.size()), std::memory_order_relaxed);
    if (entries.size() > 1) stats_.fused_responses.fetch_add(1, std::memory_order_relaxed);
  }
  if (tracing)
    TraceEnd(entries, phase,
             Describe(response, entries) + (voted_inputs_ ? ", \"voted_inputs\": true" : "") +
                 (st.ok() ? "" : ", \"error\": " + JsonString(st.message())));
  if (!st.ok()) {
    std::string what = std::string(OpTypeName(response.type)) + " of tensor '" + response.names[0] + "'";
    if (response.names.size() > 1)
      what += " (fused with " + std::to_string(response.names.size() - 1) + " more)";
    st = st.WithContext(what + " failed");
  }
  bool result_taken = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].handle == 0) continue;  // a stand-in
    HandleResult r;
    r.status = st;
    if (i == 0 && st.ok()) {
      r = std::move(result);
      result_taken = true;
    }
    // The name leaves flight before the handle completes: a caller woken by
    // the completion may submit the same name again at once.
    queue_->Finish(entries[i].request.process_set, entries[i].request.name);
    handles_->Complete(entries[i].handle, std::move(r));
  }
  if (!result_taken) FreeOutput(result.output);
  entries.clear();
  return st;
}

Status Executor::Run(const Response& r, std::vector<TensorEntry>& entries, HandleResult* result) {
  if (r.type == OpType::kAddProcessSet || r.type == OpType::kRemoveProcessSet) {
    return RunProcessSetOp(r, entries[0], result);
  }
  if (r.type == OpType::kBarrier) return Status::OK();  // negotiation itself was the barrier
  if (r.type == OpType::kJoin) {
    result->value = r.last_joined_rank;
    return Status::OK();
  }
  CollectiveContext ctx = Context(r.process_set);
  if (ctx.me < 0) return Status::Internal("rank is not a member of the process set it executes");
  if (entries[0].request.device >= 0) return RunGpu(ctx, r, entries);
  switch (r.type) {
    case OpType::kAllreduce:
      return RunAllreduce(ctx, entries);
    case OpType::kAllgather:
      return RunAllgather(ctx, r, entries[0], result);
    case OpType::kBroadcast: {
      const Request& q = entries[0].request;
      BroadcastOptions o;
      o.buf = entries[0].data;
      o.bytes = NumElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
      o.root_member = sets_->MemberIndex(r.process_set, q.root);
      return backend_->Broadcast(ctx, o);
    }
    case OpType::kAlltoall:
      return RunAlltoall(ctx, r, entries[0], result);
    case OpType::kReducescatter:
      return RunReducescatter(ctx, entries[0], result);
    default:
      return Status::Internal(std::string("cannot execute ") + OpTypeName(r.type));
  }
}

// Tensors of at least kDirectBytes reduce in place in the caller's buffer,
// one collective each (copying them into a fusion buffer and back would cost
// more than a collective's fixed overhead); the smaller ones of a fused
// response are packed into the fusion buffer, reduced together, and unpacked.
// Every rank sees the same names and shapes, so every rank makes the same calls.
Status Executor::RunAllreduce(const CollectiveContext& ctx, std::vector<TensorEntry>& entries) {
  constexpr int64_t kDirectBytes = 128 << 10;
  const Request& q = entries[0].request;
  const int64_t esize = static_cast<int64_t>(DataTypeSize(q.dtype));
  ++allreduce_responses_;
  for (auto& e : entries) allreduce_bytes_ += NumElements(e.request.shape) * esize;
  if (voted_inputs_ != nullptr) {
    stats_.voted_responses.fetch_add(1, std::memory_order_relaxed);
    return ReduceVotedInputs(ctx, entries);
  }
  std::vector<TensorEntry*> packed;
  bool first = true;  // the first collective uses ctx; later ones get their own tags
  auto next_ctx = [&] {
    CollectiveContext c = first ? ctx : Context(ctx.process_set);
    first = false;
    return c;
  };
  for (auto& e : entries) {
    const int64_t count = NumElements(e.request.shape);
    if (entries.size() > 1 && count * esize < kDirectBytes) {
      packed.push_back(&e);
      continue;
    }
    HVD_RETURN_IF_ERROR(ReduceInPlace(next_ctx(), q, e.data, count));
  }
  if (packed.empty()) return Status::OK();
  if (packed.size() == 1) {
    return ReduceInPlace(next_ctx(), q, packed[0]->data, NumElements(packed[0]->request.shape));
  }
  int64_t total = 0;
  for (auto* e : packed) total += NumElements(e->request.shape);
  char* fused = static_cast<char*>(Scratch(total * esize));
  TraceBegin(entries, "MEMCPY_IN_FUSION_BUFFER");
  PackTensors(packed, fused);
  TraceEnd(entries, "MEMCPY_IN_FUSION_BUFFER");
  HVD_RETURN_IF_ERROR(ReduceInPlace(next_ctx(), q, fused, total));
  TraceBegin(entries, "MEMCPY_OUT_FUSION_BUFFER");
  UnpackTensors(fused, packed);
  TraceEnd(entries, "MEMCPY_OUT_FUSION_BUFFER");
  return Status::OK();
}

bool Executor::VotedInput(const Response& response, Vote* vote) {
  if (response.type != OpType::kAllreduce || response.error_code != StatusCode::kOk) return false;
  std::vector<const TensorEntry*>& entries = voted_entries_;  // reused: no allocation per vote
  entries.clear();
  int64_t bytes = 0;
  for (const std::string& name : response.names) {
    const TensorEntry* e = queue_->Find(response.process_set, name);
    if (e == nullptr || e->request.device >= 0) return false;
    entries.push_back(e);
    bytes += static_cast<int64_t>(TensorBytes(*e));
  }
  const int members = sets_->Size(response.process_set);
  if (bytes == 0 || members < 2 || bytes * (members - 1) > kVotedInputMaxBytes ||
      !backend_->AllreduceIsRecursiveDoubling(bytes, members))
    return false;
  SerializeWithRoom(vote, static_cast<size_t>(bytes));
  char* input = &vote->wire[vote->input_offset];
  PackTensors(entries, input);
  const Request& q = entries[0]->request;
  if (ScaleBuffer(input, bytes / static_cast<int64_t>(DataTypeSize(q.dtype)), q.dtype, q.prescale).ok())
    return true;
  vote->wire.clear();  // (a dtype ScaleBuffer refuses: the collective reports it)
  vote->input_size = 0;
  return false;
}

// Every member reduces the same inputs along the same tree, so every member
// ends with the bits the backend's recursive doubling would leave; then the
// postscale. A single tensor receives the result directly; several are
// unpacked from the fusion buffer.
Status Executor::ReduceVotedInputs(const CollectiveContext& ctx, std::vector<TensorEntry>& entries) {
  const Reduction red = ReductionOf(entries[0].request, ctx.size());
  const int64_t esize = static_cast<int64_t>(DataTypeSize(red.dtype));
  int64_t count = 0;
  for (const auto& e : entries) count += NumElements(e.request.shape);
  if (voted_inputs_->size() != ctx.ranks.size())
    return Status::Internal("steady state: voted inputs from " + std::to_string(voted_inputs_->size()) +
                            " ranks for a set of " + std::to_string(ctx.ranks.size()));
  char* result = static_cast<char*>(entries.size() == 1 ? entries[0].data : Scratch(count * esize));
  HVD_RETURN_IF_ERROR(ReduceAsRecursiveDoubling(*voted_inputs_, result, count, red.dtype, red.op));
  HVD_RETURN_IF_ERROR(ScaleBuffer(result, count, red.dtype, red.postscale));
  if (entries.size() > 1) UnpackTensors(result, entries);
  return Status::OK();
}

// prescale, allreduce, postscale of `count` elements at `data` (the fused
// tensors share q's dtype, op and scales: they have one fusion key).
Status Executor::ReduceInPlace(const CollectiveContext& ctx, const Request& q, void* data, int64_t count) {
  AllreduceOptions o;
  static_cast<Reduction&>(o) = ReductionOf(q, ctx.size());
  o.buf = data;
  o.count = count;
  return backend_->Allreduce(ctx, o);
}

// Where an operation's `bytes` of result go: the caller's buffer when it gave one (which must
// hold them; out->output stays null, so hvdlite_take_output hands over no data), else a buffer
// the core allocates and hands over.
Status Executor::PlaceOutput(const TensorEntry& e, int64_t bytes, HandleResult* out, void** where) {
  if (e.output != nullptr) {
    if (bytes > e.output_capacity) {
      return Status::InvalidArgument(
          std::string(OpTypeName(e.request.type)) + " of tensor '" + e.request.name + "': its result is " +
          std::to_string(bytes) + " bytes, but the output given holds only " +
          std::to_string(e.output_capacity) + "; size the output for every member's contribution");
    }
    *where = e.output;
    return Status::OK();
  }
  out->output_bytes = bytes;
  out->output = AllocateOutput(bytes);
  if (out->output == nullptr && bytes > 0) {
    return Status::Internal(std::string("out of memory allocating the ") + OpTypeName(e.request.type) +
                            " output of tensor '" + e.request.name + "'");
  }
  *where = out->output;
  return Status::OK();
}

Status Executor::RunAllgather(const CollectiveContext& ctx, const Response& r, TensorEntry& e,
                              HandleResult* out) {
  const Request& q = e.request;
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  std::vector<int64_t> bytes(r.first_dims.size());
  int64_t rows = 0;
  for (size_t i = 0; i < r.first_dims.size(); ++i) {
    bytes[i] = r.first_dims[i] * row_bytes;
    rows += r.first_dims[i];
  }
  void* recv = nullptr;
  HVD_RETURN_IF_ERROR(PlaceOutput(e, rows * row_bytes, out, &recv));
  out->output_shape = q.shape.empty() ? std::vector<int64_t>{rows} : q.shape;
  out->output_shape[0] = rows;
  AllgathervOptions o;
  o.send = e.data;
  o.recv = recv;
  o.bytes = std::move(bytes);
  return backend_->Allgatherv(ctx, o);
}

Status Executor::RunAlltoall(const CollectiveContext& ctx, const Response& r, TensorEntry& e,
                             HandleResult* out) {
  const Request& q = e.request;
  const size_t n = ctx.ranks.size();
  const int64_t row_bytes = RowElements(q.shape) * static_cast<int64_t>(DataTypeSize(q.dtype));
  AlltoallvOptions o;
  std::vector<int64_t>& send = o.send_bytes;
  std::vector<int64_t>& recv = o.recv_bytes;
  send.resize(n);
  recv.resize(n);
  int64_t recv_rows = 0;
  out->received_splits.resize(n);
  for (size_t j = 0; j < n; ++j) {
    send[j] = r.split_matrix[ctx.me * n + j] * row_bytes;
    out->received_splits[j] = r.split_matrix[j * n + ctx.me];
    recv[j] = out->received_splits[j] * row_bytes;
    recv_rows += out->received_splits[j];
  }
  void* recv_buf = nullptr;
  HVD_RETURN_IF_ERROR(PlaceOutput(e, recv_rows * row_bytes, out, &recv_buf));
  out->output_shape = q.shape;
  out->output_shape[0] = recv_rows;
  o.send = e.data;
  o.recv = recv_buf;
  HVD_RETURN_IF_ERROR(backend_->Alltoallv(ctx, o));
  int64_t elsewhere = 0;
  for (size_t j = 0; j < n; ++j) elsewhere += j == static_cast<size_t>(ctx.me) ? 0 : send[j];
  stats_.alltoall_bytes_sent.fetch_add(elsewhere, std::memory_order_relaxed);
  return Status::OK();
}

// Rows of the first dimension are split across members, the first
// (rows % size) members taking one extra row, as Horovod does.
Status Executor::RunReducescatter(const CollectiveContext& ctx, TensorEntry& e, HandleResult* out) {
  const Request& q = e.request;
  const int64_t n = static_cast<int64_t>(ctx.ranks.size());
  const int64_t rows = q.shape[0], row = RowElements(q.shape);
  const size_t esize = DataTypeSize(q.dtype);
  ReduceScatterOptions o;
  static_cast<Reduction&>(o) = ReductionOf(q, static_cast<int>(n));
  std::vector<int64_t>& counts = o.counts;
  counts.resize(n);
  for (int64_t i = 0; i < n; ++i) counts[i] = (rows / n + (i < rows % n ? 1 : 0)) * row;
  void* result = nullptr;
  HVD_RETURN_IF_ERROR(PlaceOutput(e, counts[ctx.me] * static_cast<int64_t>(esize), out, &result));
  out->output_shape = q.shape;
  out->output_shape[0] = counts[ctx.me] / (row ? row : 1);
  if (row == 0) out->output_shape[0] = rows / n + (ctx.me < rows % n ? 1 : 0);
  o.in = e.data;  // the backend only reads it (a prescale works on a copy)
  o.out = result;
  return backend_->ReduceScatter(ctx, o);
}

Status Executor::RunProcessSetOp(const Response& r, TensorEntry& e, HandleResult* out) {
  if (r.type == OpType::kAddProcessSet) {
    int32_t id = r.new_set_id;
    std::vector<int> members(e.request.set_members.begin(), e.request.set_members.end());
    HVD_RETURN_IF_ERROR(backend_->AddProcessSet(id, members));
    sets_->Add(id, std::move(members));
    out->value = id;
  } else {
    const int32_t id = e.request.target_set;
    backend_->RemoveProcessSet(id);
    if (GpuBackend* gpu = gpu_.load()) gpu->RemoveProcessSet(id);
    // Rank 0's table is the coordinator's, which removed the set when it decided this and may
    // since have staged a new set under the freed id (a registration among other members):
    // removing again here would drop that one.
    if (rank_ != 0) sets_->Remove(id);
    sequence_.erase(id);
  }
  return Status::OK();
}

// CUDA tensors: the runtime admitted only allreduce and broadcast, and only
// after loading the module (Runtime::Enqueue).
Status Executor::RunGpu(const CollectiveContext& ctx, const Response& r, std::vector<TensorEntry>& entries) {
  GpuBackend* gpu = gpu_.load();
  if (gpu == nullptr)
    return Status::Internal("a CUDA tensor was scheduled but the NCCL module is not loaded");
  const Request& q = entries[0].request;
  GpuOp op;
  static_cast<Reduction&>(op) = ReductionOf(q, ctx.size());
  op.device = q.device;
  op.root_member = r.type == OpType::kBroadcast ? sets_->MemberIndex(r.process_set, q.root) : 0;
  for (auto& e : entries) op.tensors.push_back(GpuTensor{e.data, NumElements(e.request.shape), e.stream});
  if (r.type == OpType::kAllreduce) return gpu->Allreduce(ctx, op);
  if (r.type == OpType::kBroadcast) return gpu->Broadcast(ctx, op);
  return Status::NotSupported(std::string(OpTypeName(r.type)) + " of CUDA tensors is not supported");
}

}  // namespace hvdlite
