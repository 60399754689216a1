// The C ABI over the one Runtime object of this process.
#include "hvdlite/c_api.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "backend/backend.h"
#include "backend/gpu_backend.h"
#include "rendezvous/tcp_store.h"
#include "runtime/runtime.h"

using namespace hvdlite;

namespace {

std::mutex g_mu;                     // guards g_runtime's lifetime (init/shutdown)
std::shared_ptr<Runtime> g_runtime;  // the process's runtime; null when not initialized

std::shared_ptr<Runtime> Current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_runtime;
}

int Report(const Status& st, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) {  // the message, cut to fit (not strncpy: it zero-fills all of err)
    const std::string& m = st.message();
    const size_t n = std::min(m.size(), err_len - 1);
    std::memcpy(err, m.data(), n);
    err[n] = '\0';
  }
  return static_cast<int>(st.code());
}

Status NotInitialized() { return Status::Precondition("hvdlite is not initialized; call hvd.init() first"); }

// A wait that returned `st` ended on its time limit with the operation still
// pending (a Timeout status can also be the operation's own result).
bool StillPending(Runtime& rt, const Status& st, int64_t handle) {
  return st.code() == StatusCode::kTimeout && rt.handles().Poll(handle) == 0;
}

Status WaitFor(Runtime& rt, int64_t handle, HandleResult* out) {
  while (true) {
    Status st = rt.Wait(handle, 1.0);
    if (StillPending(rt, st, handle)) continue;
    rt.handles().Take(handle, out);
    return st;
  }
}

// hvdlite_enqueue's checks and submission on a live runtime.
int Enqueue(Runtime& rt, const hvdlite_op* op, int64_t* handle, char* err, size_t err_len,
            void* output = nullptr, int64_t output_nbytes = 0) {
  if (!IsValidDataType(op->dtype))
    return Report(Status::InvalidArgument("unsupported dtype code " + std::to_string(op->dtype)), err,
                  err_len);
  if (!IsValidReduceOp(op->reduce_op))
    return Report(Status::InvalidArgument("unknown reduce op " + std::to_string(op->reduce_op)), err,
                  err_len);
  const bool user_op = (op->type >= 0 && op->type <= static_cast<int32_t>(OpType::kBarrier)) ||
                       op->type == static_cast<int32_t>(OpType::kJoin);
  if (!user_op)
    return Report(Status::InvalidArgument("unknown op type " + std::to_string(op->type)), err, err_len);
  if (op->ndim < 0 || op->ndim > HVDLITE_MAX_DIMS)
    return Report(Status::InvalidArgument("too many dimensions"), err, err_len);
  // reducescatter and alltoall split their first dimension across ranks: a 0-d tensor has none.
  // Every adapter checks this too; this guard keeps a direct caller from crashing the core.
  const bool splits_first_dim = op->type == static_cast<int32_t>(OpType::kReducescatter) ||
                                op->type == static_cast<int32_t>(OpType::kAlltoall);
  if (splits_first_dim && op->ndim == 0)
    return Report(Status::InvalidArgument(std::string(OpTypeName(static_cast<OpType>(op->type))) +
                                          " of tensor '" + (op->name ? op->name : "") +
                                          "' needs at least one dimension; reshape a scalar to [1]"),
                  err, err_len);
  Request r;
  r.type = static_cast<OpType>(op->type);
  r.name = op->name ? op->name : "";
  r.dtype = static_cast<DataType>(op->dtype);
  r.shape.assign(op->shape, op->shape + op->ndim);
  r.op = static_cast<ReduceOp>(op->reduce_op);
  r.root = op->root;
  r.prescale = op->prescale;
  r.postscale = op->postscale;
  r.process_set = op->process_set;
  r.device = op->device < 0 ? -1 : op->device;
  if (op->splits) r.splits.assign(op->splits, op->splits + op->nsplits);
  return Report(rt.Enqueue(std::move(r), op->data, handle, op->stream, output, output_nbytes), err, err_len);
}

}  // namespace

extern "C" {

int hvdlite_init(char* err, size_t err_len) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_runtime) return 0;
  std::unique_ptr<Runtime> rt;
  Status st = Runtime::Create(&rt);
  if (!st.ok()) return Report(st.WithContext("hvdlite init failed"), err, err_len);
  g_runtime = std::move(rt);
  return 0;
}

int hvdlite_shutdown(char* err, size_t err_len) {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    rt.swap(g_runtime);
  }
  if (!rt) return 0;
  return Report(rt->Shutdown(), err, err_len);
}

int hvdlite_is_initialized(void) { return Current() ? 1 : 0; }

int hvdlite_topology(int which) {
  auto rt = Current();
  if (!rt) return -1;
  const Topology& t = rt->topology();
  const int values[] = {t.rank, t.size, t.local_rank, t.local_size, t.cross_rank, t.cross_size};
  return (which >= 0 && which < 6) ? values[which] : -1;
}

int hvdlite_enqueue(const hvdlite_op* op, int64_t* handle, char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  return Enqueue(*rt, op, handle, err, err_len);
}

int hvdlite_enqueue_into(const hvdlite_op* op, void* output, int64_t output_nbytes, int64_t* handle,
                         char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  return Enqueue(*rt, op, handle, err, err_len, output, output_nbytes);
}

int hvdlite_p2p(int32_t kind, const char* name, void* data, int64_t nbytes, int32_t peer, int32_t tag,
                int32_t process_set, int32_t device, int64_t* handle, char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  P2pEngine::Op op;
  op.send = kind == 0;
  op.name = name ? name : "";
  if ((kind != 0 && kind != 1) || nbytes < 0)
    return Report(Status::InvalidArgument("point-to-point of tensor '" + op.name + "': bad kind or size"),
                  err, err_len);
  op.device = device;  // CUDA: through the NCCL module (runtime/p2p_device.cc)
  op.data = static_cast<char*>(data);
  op.bytes = static_cast<size_t>(nbytes);
  op.peer = peer;
  op.tag = tag;
  op.process_set = process_set;
  return Report(rt->PostP2p(std::move(op), handle), err, err_len);
}

int hvdlite_submit_wait(const hvdlite_op* op, double slice_s, int64_t* handle, int64_t* token, char* err,
                        size_t err_len) {
  *handle = 0;
  *token = 0;
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  int64_t h = 0;
  const int code = Enqueue(*rt, op, &h, err, err_len);
  if (code != 0) return code;
  int64_t t = 0;  // registered by Wait only if the wait lasts (Runtime::Wait)
  Status st = rt->Wait(h, slice_s, &t);
  if (StillPending(*rt, st, h)) {
    *handle = h;
    *token = t;
    return Report(st, err, err_len);
  }
  if (t != 0) rt->EndWait(t);
  rt->handles().Release(h);
  return Report(st, err, err_len);
}

int hvdlite_poll(int64_t handle) {
  auto rt = Current();
  return rt ? rt->handles().Poll(handle) : -1;
}

int hvdlite_wait(int64_t handle, double timeout_s, char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  return Report(rt->Wait(handle, timeout_s), err, err_len);
}

int64_t hvdlite_wait_begin(const int64_t* handles, int32_t n) {
  auto rt = Current();
  if (!rt || n <= 0) return 0;
  return rt->BeginWait(std::vector<int64_t>(handles, handles + n));
}

void hvdlite_wait_end(int64_t token) {
  if (token == 0) return;
  auto rt = Current();
  if (rt) rt->EndWait(token);
}

int hvdlite_take_output(int64_t handle, hvdlite_output* out, char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  HandleResult res;
  if (!rt->handles().Take(handle, &res))
    return Report(Status::InvalidArgument("handle is unknown or still pending"), err, err_len);
  std::memset(out, 0, sizeof(*out));
  out->data = res.output;
  out->nbytes = res.output_bytes;
  out->ndim = static_cast<int32_t>(std::min<size_t>(res.output_shape.size(), HVDLITE_MAX_DIMS));
  for (int i = 0; i < out->ndim; ++i) out->shape[i] = res.output_shape[i];
  out->value = res.value;
  if (!res.received_splits.empty()) {
    out->nsplits = static_cast<int32_t>(res.received_splits.size());
    out->received_splits = static_cast<int64_t*>(AllocateOutput(out->nsplits * 8));
    std::memcpy(out->received_splits, res.received_splits.data(), out->nsplits * 8);
  }
  if (!res.status.ok()) {
    FreeOutput(out->data);
    FreeOutput(out->received_splits);
    std::memset(out, 0, sizeof(*out));
  }
  return Report(res.status, err, err_len);
}

void hvdlite_release(int64_t handle) {
  if (auto rt = Current()) rt->handles().Release(handle);
}

void hvdlite_free_output(void* p) { FreeOutput(p); }

static int RunProcessSetOp(const Request& r, int32_t* id, char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  int64_t handle = 0;
  Status st = rt->Enqueue(r, nullptr, &handle);
  if (!st.ok()) return Report(st, err, err_len);
  HandleResult res;
  st = WaitFor(*rt, handle, &res);
  if (id) *id = res.value;
  return Report(st, err, err_len);
}

int hvdlite_add_process_set(const int32_t* ranks, int32_t n, int32_t among_members, int32_t* id, char* err,
                            size_t err_len) {
  Request r;
  r.type = OpType::kAddProcessSet;
  r.name = "__add_process_set__";
  r.set_members.assign(ranks, ranks + n);
  if (among_members) {
    // Concurrent registrations of different sets (each among its own members) stay apart by name.
    r.process_set = kAmongMembers;
    for (int32_t i = 0; i < n; ++i) r.name += (i ? "," : ".") + std::to_string(ranks[i]);
  }
  return RunProcessSetOp(r, id, err, err_len);
}

int hvdlite_remove_process_set(int32_t id, int32_t among_members, char* err, size_t err_len) {
  Request r;
  r.type = OpType::kRemoveProcessSet;
  r.name = "__remove_process_set__";
  r.target_set = id;
  if (among_members) {
    // Negotiated on the set itself, so only its members take part (as the set's collectives do);
    // the name carries the members, so a stall error names the set and who it waits for.
    auto rt = Current();
    if (!rt) return Report(NotInitialized(), err, err_len);
    const std::vector<int> members = rt->process_sets().Ranks(id);
    if (id == 0 || members.empty()) {
      return Report(
          Status::InvalidArgument("remove_process_set among members: process set " + std::to_string(id) +
                                  (id == 0 ? " is the global set, which is never removed"
                                           : " does not exist (removed already?)")),
          err, err_len);
    }
    r.process_set = id;
    r.name += "." + std::to_string(id) + "[";
    for (size_t i = 0; i < members.size(); ++i) r.name += (i ? "," : "") + std::to_string(members[i]);
    r.name += "]";
  }
  return RunProcessSetOp(r, nullptr, err, err_len);
}

int hvdlite_process_set_ids(int32_t* ids, int32_t cap) {
  auto rt = Current();
  if (!rt) return -1;
  const std::vector<int32_t> all = rt->process_sets().Ids();
  for (int32_t i = 0; i < cap && i < static_cast<int32_t>(all.size()); ++i) ids[i] = all[i];
  return static_cast<int>(all.size());
}

int hvdlite_process_set_ranks(int32_t id, int32_t* ranks, int32_t cap) {
  auto rt = Current();
  if (!rt) return -1;
  std::vector<int> members = rt->process_sets().Ranks(id);
  if (members.empty()) return -1;
  for (int32_t i = 0; i < cap && i < static_cast<int32_t>(members.size()); ++i) ranks[i] = members[i];
  return static_cast<int>(members.size());
}

int hvdlite_start_timeline(const char* path, int mark_cycles, char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  return Report(rt->StartTimeline(path, mark_cycles != 0), err, err_len);
}

int hvdlite_stop_timeline(char* err, size_t err_len) {
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  rt->StopTimeline();
  return 0;
}

void* hvdlite_store_server_start(const char* host, int port, const char* secret, size_t secret_len,
                                 int expected_clients, int* bound_port, char* err, size_t err_len) {
  std::unique_ptr<TcpStoreServer> server;
  Status st = StartTcpStoreServer(host, port, std::string(secret, secret_len), &server, expected_clients);
  if (!st.ok()) {
    Report(st, err, err_len);
    return nullptr;
  }
  *bound_port = server->port();
  return server.release();
}

void hvdlite_store_server_stop(void* server) {
  auto* s = static_cast<TcpStoreServer*>(server);
  if (s) {
    s->Stop();
    delete s;
  }
}

const char* hvdlite_built_backends(void) {
  static std::string names = [] {
    std::string s;
    for (const char* n : BuiltBackends()) s += (s.empty() ? "" : ",") + std::string(n);
    return s;
  }();
  return names.c_str();
}

int hvdlite_mpi_enabled(void) {
  auto rt = Current();
  if (!rt) return 0;
  return (rt->topology().via_mpi || std::string(rt->cpu_backend_name()) == "mpi") ? 1 : 0;
}

int hvdlite_mpi_thread_level(void) { return MpiThreadLevel(); }

int hvdlite_gpu_module_installed(void) { return GpuModuleInstalled() ? 1 : 0; }

int hvdlite_get_stats(hvdlite_stats* out, char* err, size_t err_len) {
  *out = hvdlite_stats{};
  auto rt = Current();
  if (!rt) return Report(NotInitialized(), err, err_len);
  const Executor::Stats& s = rt->executor_stats();
  out->allreduce_responses = s.allreduce_responses.load(std::memory_order_relaxed);
  out->allreduce_tensors = s.allreduce_tensors.load(std::memory_order_relaxed);
  out->fused_responses = s.fused_responses.load(std::memory_order_relaxed);
  out->scheduled_responses = s.scheduled_responses.load(std::memory_order_relaxed);
  out->voted_responses = s.voted_responses.load(std::memory_order_relaxed);
  out->alltoall_bytes_sent = s.alltoall_bytes_sent.load(std::memory_order_relaxed);
  if (const Coordinator* c = rt->coordinator()) {
    out->cache_entries = c->cache_entries();
    out->cache_evictions = c->cache_evictions();
  }
  return 0;
}

}  // extern "C"
