// Finds and loads the NCCL module (see gpu_backend.h). No CUDA here: only
// dlopen of a file that may be absent.
#include <dlfcn.h>
#include <sys/stat.h>

#include <string>

#include "backend/gpu_backend.h"

namespace hvdlite {
namespace {

// The directory of the shared object this function is compiled into (the
// Python extension hvdlite/_core*.so), where setup.py installs the module.
std::string ModulePath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ModulePath), &info) == 0 || info.dli_fname == nullptr)
    return kGpuModuleFile;
  std::string self = info.dli_fname;
  auto slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/" + kGpuModuleFile;
}

const char* kNotBuilt =
    "this hvdlite was built without CUDA/NCCL support, so CUDA tensors cannot be used: rebuild where nvcc "
    "and "
    "the nvidia-nccl-cu13 wheel are installed (`make install` does it when nvcc is on PATH; "
    "HVDLITE_WITH_CUDA=1 makes their absence a build error), or move the tensor to the CPU";

}  // namespace

bool GpuModuleInstalled() {
  struct stat st{};
  return ::stat(ModulePath().c_str(), &st) == 0;
}

Status LoadGpuBackend(GpuHost* host, std::unique_ptr<GpuBackend>* out) {
  const std::string path = ModulePath();
  if (!GpuModuleInstalled()) return Status::NotSupported(std::string(kNotBuilt) + " (no " + path + ")");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded until the process exits
  if (lib == nullptr) {
    const char* why = dlerror();
    return Status::NotSupported("cannot load hvdlite's NCCL module " + path + ": " +
                                (why ? why : "unknown error") +
                                " (is NCCL's libnccl.so.2, from the nvidia-nccl-cu13 wheel, installed?)");
  }
  auto create = reinterpret_cast<GpuBackendFactory>(dlsym(lib, kGpuFactorySymbol));
  if (create == nullptr) return Status::Internal(path + " does not export " + kGpuFactorySymbol);
  char err[1024] = {0};
  GpuBackend* backend = nullptr;
  int code = create(kGpuAbiVersion, host, &backend, err, sizeof(err));
  if (code != 0 || backend == nullptr) return Status(static_cast<StatusCode>(code ? code : 7), err);
  out->reset(backend);
  return Status::OK();
}

}  // namespace hvdlite
