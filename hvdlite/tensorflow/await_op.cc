// HvdliteAwait: a TensorFlow kernel that waits for hvdlite operations without
// holding one of TensorFlow's executor threads.
//
// In a graph, every collective is a non-blocking submission (a numpy_function
// that enqueues and returns handles), this kernel, and a numpy_function that
// takes the result. An executor thread that blocked until a collective
// completed could wait for a rank that is itself blocked in another
// collective of the same graph, with no thread left to submit the one it
// needs: with more independent collectives than executor threads the job
// hangs whenever ranks run them in different orders. This kernel is an
// AsyncOpKernel: ComputeAsync returns at once and a thread of its own waits.
//
// It is built against the installed TensorFlow by setup.py (a library apart
// from the core, which stays framework-free) and talks to the core only
// through the C ABI (hvdlite_wait, hvdlite_poll), whose addresses Python hands
// it once with hvdlite_tf_set_core (hvdlite/tensorflow/await_op.py).
//
// Contract: input 0 holds core handles (int64, any shape); input 1 passes
// through to the output once every handle has completed, or the handle is
// unknown, or the runtime is gone. An operation that failed because ranks
// disagree (shape, dtype, root: the core's Mismatch or Precondition) or on a
// bad argument (InvalidArgument) fails this op with TensorFlow's
// FailedPrecondition / InvalidArgument status, as Horovod's kernels report
// them (a numpy_function can only raise UnknownError for these); the failed
// operation's user handle then stays unsynchronized (a few bytes per failed
// collective). Any other failure passes through: the result's numpy_function
// raises the operation's error.
//
// HvdliteExclusive: the same library's second op. Its output holds its input's
// values in a buffer that no other tensor shares: the input's own buffer when
// TensorFlow can forward it (nothing else holds the input: the usual case for
// a freshly computed gradient), else a copy. An in-place collective (allreduce,
// broadcast) may then write into that buffer, which a numpy_function sees as
// its input array, without the copy it would otherwise need. It is stateful so
// that grappler never merges two of them on the same input (common-subexpression
// elimination) nor folds one on a constant into a constant: either would hand
// one buffer to two writers, or write into a constant. Its one consumer must be
// the op that writes.
//
// HvdliteAllreduceSubmit: an allreduce started from C++ (hvdlite_enqueue), with no
// Python call: its output `y` is HvdliteExclusive's (the input's own buffer when it
// can be forwarded, else a copy), handed to the core, which reduces into it in place;
// `handle` is the core handle. Its one consumer must be HvdliteAwait with release=true,
// whose output is then the reduced tensor (the core is done with the buffer by then).
// The library also holds the buffer until the handle completes (g_started), so that
// the core never writes into freed memory when the await does not run.
// The name, reduce op, scale factors, process set id and the core's dtype code are
// attributes that Python resolves when the graph is built (hvdlite/tensorflow/await_op.py);
// the op holds no policy of its own. It is stateful (never merged, pruned or constant-
// folded; await_op.py lifts tf.function's program-order chain for it) and cheap: it never blocks (the core's
// enqueue only queues), so it declares itself inexpensive and TensorFlow's executor runs it inline the moment
// its gradient exists, instead of queueing it behind the rest of the backward pass as it queues expensive
// kernels (a numpy_function is one).
//
// HvdliteAwait's `release` attribute: when true, the core handle is released once it
// completed, and every failure fails the op (there is no later Python step to raise it).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "hvdlite/c_api.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using WaitFn = int (*)(int64_t handle, double timeout_s, char* err, size_t err_len);
using PollFn = int (*)(int64_t handle);
using EnqueueFn = int (*)(const hvdlite_op* op, int64_t* handle, char* err, size_t err_len);
using ReleaseFn = void (*)(int64_t handle);
std::atomic<WaitFn> g_wait{nullptr};
std::atomic<PollFn> g_poll{nullptr};
std::atomic<EnqueueFn> g_enqueue{nullptr};
std::atomic<ReleaseFn> g_release{nullptr};

// The buffers of started allreduces, by core handle: the core writes into one until its
// handle completes, whether or not its HvdliteAwait ever runs (grappler turns a stateless
// op whose result only feeds control edges into a NoOp; an aborted step never runs it).
// HvdliteAwait(release) drops the entry once the handle completed; every submission drops
// the entries of completed handles whose await never came.
// Never destroyed: an entry left at exit must not be freed after TensorFlow's allocators.
std::mutex g_started_mu;
auto* g_started = new std::unordered_map<int64_t, tensorflow::Tensor>();  // guarded by g_started_mu

void KeepStarted(int64_t handle, const tensorflow::Tensor& buffer, PollFn poll) {
  std::lock_guard<std::mutex> lock(g_started_mu);
  for (auto it = g_started->begin(); it != g_started->end();) {
    it = (poll != nullptr && poll(it->first) != 0) ? g_started->erase(it) : std::next(it);
  }
  g_started->insert_or_assign(handle, buffer);
}

void DropStarted(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_started_mu);
  g_started->erase(handle);
}
// StatusCode (csrc/common/status.h).
constexpr int kInvalidArgument = 1;
constexpr int kMismatch = 2;
constexpr int kAborted = 3;
constexpr int kTimeout = 4;
constexpr int kNotSupported = 5;
constexpr int kPrecondition = 6;

// TensorFlow's status for any core status code (OK for 0).
tensorflow::Status FromCore(int code, const char* err) {
  switch (code) {
    case 0:
      return tensorflow::Status();
    case kInvalidArgument:
      return tensorflow::errors::InvalidArgument(err);
    case kMismatch:
    case kPrecondition:
      return tensorflow::errors::FailedPrecondition(err);
    case kAborted:
      return tensorflow::errors::Aborted(err);
    case kTimeout:
      return tensorflow::errors::DeadlineExceeded(err);
    case kNotSupported:
      return tensorflow::errors::Unimplemented(err);
    default:
      return tensorflow::errors::Internal(err);
  }
}

// TensorFlow's status for a completed handle's core status (OK for the codes
// left to the result's numpy_function).
tensorflow::Status StatusOf(WaitFn wait, int64_t handle) {
  char err[1024] = {0};
  int code = wait(handle, 0.0, err, sizeof(err));
  if (code == kMismatch || code == kPrecondition || code == kInvalidArgument) return FromCore(code, err);
  return tensorflow::Status();
}

// Blocks the calling thread until `handle` is no longer pending.
void AwaitOne(WaitFn wait, PollFn poll, int64_t handle) {
  char err[256];
  while (wait(handle, 1.0, err, sizeof(err)) == kTimeout && poll(handle) == 0) {
  }
}

class HvdliteAwaitOp : public tensorflow::AsyncOpKernel {
 public:
  explicit HvdliteAwaitOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("release", &release_));
  }
  // Only starts a thread: run inline (see HvdliteAllreduceSubmit).
  bool IsExpensive() override { return false; }

  void ComputeAsync(tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    WaitFn wait = g_wait.load();
    PollFn poll = g_poll.load();
    OP_REQUIRES_ASYNC(ctx, wait != nullptr && poll != nullptr,
                      tensorflow::errors::FailedPrecondition(
                          "HvdliteAwait: the hvdlite core was not registered (import hvdlite.tensorflow)"),
                      done);
    auto flat = ctx->input(0).flat<int64_t>();
    std::vector<int64_t> handles(flat.data(), flat.data() + flat.size());
    ctx->set_output(0, ctx->input(1));
    // One thread per call: it sleeps in the core's wait (or drives the core's
    // engine meanwhile), never in TensorFlow's pools. `done` outlives it; `ctx`
    // stays valid until done() is called.
    ReleaseFn release = release_ ? g_release.load() : nullptr;
    OP_REQUIRES_ASYNC(
        ctx, !release_ || release != nullptr,
        tensorflow::errors::FailedPrecondition("HvdliteAwait: hvdlite_release was not registered"), done);
    std::thread([ctx, wait, poll, release, handles = std::move(handles), done = std::move(done)]() {
      for (int64_t h : handles) AwaitOne(wait, poll, h);
      for (int64_t h : handles) {
        tensorflow::Status status;
        if (release != nullptr) {
          char err[1024] = {0};
          status = FromCore(wait(h, 0.0, err, sizeof(err)), err);
          release(h);
          DropStarted(h);
        } else {
          status = StatusOf(wait, h);
        }
        if (!status.ok() && ctx->status().ok()) ctx->SetStatus(status);
      }
      done();
    }).detach();
  }

 private:
  bool release_ = false;
};

// Output `index` := input 0's values in a buffer no other tensor shares: input 0's own
// when TensorFlow can forward it (nothing else holds it), else a copy.
tensorflow::Status ExclusiveOutput(tensorflow::OpKernelContext* ctx, int index, tensorflow::Tensor** out) {
  const tensorflow::Tensor& in = ctx->input(0);
  TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({0}, index, in.shape(), out));
  auto src = in.tensor_data();
  auto dst = (*out)->tensor_data();
  if (dst.data() != src.data() && src.size() > 0) {
    std::memcpy(const_cast<char*>(dst.data()), src.data(), src.size());
  }
  return tensorflow::Status();
}

class HvdliteExclusiveOp : public tensorflow::OpKernel {
 public:
  explicit HvdliteExclusiveOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ExclusiveOutput(ctx, 0, &out));
  }
};

// y = the input in a buffer of its own (as HvdliteExclusive), whose allreduce the core
// has started in place; handle = its core handle.
class HvdliteAllreduceSubmitOp : public tensorflow::OpKernel {
 public:
  explicit HvdliteAllreduceSubmitOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tensor_name", &name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduce_op", &reduce_op_));
    int64_t bits = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("prescale_bits", &bits));
    std::memcpy(&prescale_, &bits, sizeof(double));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("postscale_bits", &bits));
    std::memcpy(&postscale_, &bits, sizeof(double));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("process_set", &process_set_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("core_dtype", &core_dtype_));
  }
  bool IsExpensive() override { return false; }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    EnqueueFn enqueue = g_enqueue.load();
    OP_REQUIRES(
        ctx, enqueue != nullptr,
        tensorflow::errors::FailedPrecondition(
            "HvdliteAllreduceSubmit: the hvdlite core was not registered (import hvdlite.tensorflow)"));
    const tensorflow::Tensor& in = ctx->input(0);
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ExclusiveOutput(ctx, 1, &out));
    auto dst = out->tensor_data();
    std::vector<int64_t> shape(in.dims());
    for (int i = 0; i < in.dims(); ++i) shape[i] = in.dim_size(i);
    static char empty_data = 0;  // an empty tensor may have no buffer; the core reads none of it
    hvdlite_op op{};
    op.type = 0;  // allreduce
    op.name = name_.c_str();
    op.data = dst.size() > 0 ? const_cast<char*>(dst.data()) : &empty_data;
    op.dtype = core_dtype_;
    op.shape = shape.data();
    op.ndim = in.dims();
    op.reduce_op = reduce_op_;
    op.prescale = prescale_;
    op.postscale = postscale_;
    op.process_set = process_set_;
    op.device = -1;
    int64_t handle = 0;
    char err[1024] = {0};
    OP_REQUIRES_OK(ctx, FromCore(enqueue(&op, &handle, err, sizeof(err)), err));
    KeepStarted(handle, *out, g_poll.load());
    tensorflow::Tensor* handle_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &handle_out));
    handle_out->scalar<int64_t>()() = handle;
  }

 private:
  std::string name_;
  int reduce_op_ = 0;
  double prescale_ = 1.0;  // attributes carry the double's bits: TensorFlow has no double attribute
  double postscale_ = 1.0;
  int process_set_ = 0;
  int core_dtype_ = 0;
};

}  // namespace

extern "C" void hvdlite_tf_set_core(void* wait, void* poll) {
  g_wait.store(reinterpret_cast<WaitFn>(wait));
  g_poll.store(reinterpret_cast<PollFn>(poll));
}

// The core's hvdlite_enqueue and hvdlite_release, for HvdliteAllreduceSubmit / HvdliteAwait(release).
extern "C" void hvdlite_tf_set_submit(void* enqueue, void* release) {
  g_enqueue.store(reinterpret_cast<EnqueueFn>(enqueue));
  g_release.store(reinterpret_cast<ReleaseFn>(release));
}

REGISTER_OP("HvdliteAwait")
    .Input("handles: int64")
    .Input("token: T")
    .Output("out: T")
    .Attr("T: type")
    .Attr("release: bool = false")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      return tensorflow::Status();
    })
    .Doc("Passes `token` through once every hvdlite core handle in `handles` has completed.");

REGISTER_KERNEL_BUILDER(Name("HvdliteAwait").Device(tensorflow::DEVICE_CPU), HvdliteAwaitOp);

REGISTER_OP("HvdliteExclusive")
    .Input("x: T")
    .Output("y: T")
    .Attr("T: type")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return tensorflow::Status();
    })
    .Doc("y = x in a buffer no other tensor shares (x's own when it can be forwarded).");

REGISTER_KERNEL_BUILDER(Name("HvdliteExclusive").Device(tensorflow::DEVICE_CPU), HvdliteExclusiveOp);

REGISTER_OP("HvdliteAllreduceSubmit")
    .Input("x: T")
    .Output("handle: int64")
    .Output("y: T")
    .Attr("T: type")
    .Attr("tensor_name: string")
    .Attr("reduce_op: int")
    .Attr("prescale_bits: int")
    .Attr("postscale_bits: int")
    .Attr("process_set: int")
    .Attr("core_dtype: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->input(0));
      return tensorflow::Status();
    })
    .Doc("Starts the core's in-place allreduce of x (in y, x's own buffer when it can be forwarded).");

REGISTER_KERNEL_BUILDER(Name("HvdliteAllreduceSubmit").Device(tensorflow::DEVICE_CPU),
                        HvdliteAllreduceSubmitOp);
