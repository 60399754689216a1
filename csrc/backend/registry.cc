// The one place that knows which backends this build has.
#include <string>

#include "algorithms/reduce_kernels.h"
#include "backend/backend.h"

namespace hvdlite {

std::unique_ptr<Backend> NewRingBackend(Transport* transport);

std::vector<const char*> BuiltBackends() { return {"ring"}; }

Status Backend::AllreduceAndScale(const CollectiveContext& ctx, void* buf, int64_t count, DataType dtype,
                                  ReduceOp op, double postscale) {
  HVD_RETURN_IF_ERROR(Allreduce(ctx, buf, count, dtype, op));
  return ScaleBuffer(buf, count, dtype, postscale);
}

Status CreateCpuBackend(const Config& cfg, Transport* transport, std::unique_ptr<Backend>* out) {
  const std::string& want = cfg.CPU_OPERATIONS;
  if (want == "ring" || want == "gloo" || want.empty()) {
    *out = NewRingBackend(transport);
    return Status::OK();
  }
  return Status::NotSupported("HVDLITE_CPU_OPERATIONS=" + want +
                              " is not available in this build; available: ring");
}

}  // namespace hvdlite
