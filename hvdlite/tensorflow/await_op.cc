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
// through to the output once every handle has completed (successfully or
// not: the result's numpy_function raises the operation's error), or the
// handle is unknown, or the runtime is gone.
#include <atomic>
#include <cstdint>
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
constexpr int kTimeout = 4;  // StatusCode::kTimeout (csrc/common/status.h)

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
    // engine meanwhile), never in TensorFlow's pools. `done` outlives it.
    std::thread([wait, poll, handles = std::move(handles), done = std::move(done)]() {
      for (int64_t h : handles) AwaitOne(wait, poll, h);
      done();
    }).detach();
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
