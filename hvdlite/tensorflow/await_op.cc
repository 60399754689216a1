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
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using WaitFn = int (*)(int64_t handle, double timeout_s, char* err, size_t err_len);
using PollFn = int (*)(int64_t handle);
std::atomic<WaitFn> g_wait{nullptr};
std::atomic<PollFn> g_poll{nullptr};
// StatusCode (csrc/common/status.h).
constexpr int kInvalidArgument = 1;
constexpr int kMismatch = 2;
constexpr int kTimeout = 4;
constexpr int kPrecondition = 6;

// TensorFlow's status for a completed handle's core status (OK for the codes
// left to the result's numpy_function).
tensorflow::Status StatusOf(WaitFn wait, int64_t handle) {
  char err[1024] = {0};
  int code = wait(handle, 0.0, err, sizeof(err));
  if (code == kMismatch || code == kPrecondition) return tensorflow::errors::FailedPrecondition(err);
  if (code == kInvalidArgument) return tensorflow::errors::InvalidArgument(err);
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
  explicit HvdliteAwaitOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {}

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
    std::thread([ctx, wait, poll, handles = std::move(handles), done = std::move(done)]() {
      for (int64_t h : handles) AwaitOne(wait, poll, h);
      for (int64_t h : handles) {
        tensorflow::Status status = StatusOf(wait, h);
        if (!status.ok()) {
          ctx->SetStatus(status);
          break;
        }
      }
      done();
    }).detach();
  }
};

class HvdliteExclusiveOp : public tensorflow::OpKernel {
 public:
  explicit HvdliteExclusiveOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& in = ctx->input(0);
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, in.shape(), &out));
    auto src = in.tensor_data();
    auto dst = out->tensor_data();
    if (dst.data() != src.data() && src.size() > 0) {
      std::memcpy(const_cast<char*>(dst.data()), src.data(), src.size());
    }
  }
};

}  // namespace

extern "C" void hvdlite_tf_set_core(void* wait, void* poll) {
  g_wait.store(reinterpret_cast<WaitFn>(wait));
  g_poll.store(reinterpret_cast<PollFn>(poll));
}

REGISTER_OP("HvdliteAwait")
    .Input("handles: int64")
    .Input("token: T")
    .Output("out: T")
    .Attr("T: type")
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
