// hvdlite._core: a thin pybind11 layer over the C ABI (c_api.h). It converts
// arguments and releases the GIL around blocking calls; it raises nothing for
// operation failures: functions return (status code, message) and the Python
// package maps codes to its exception family (hvdlite/common/exceptions.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "hvdlite/c_api.h"
#include "hvdlite_build_info.h"
#include "python/op_calls.h"
#include "python/sign_kernels.h"

namespace py = pybind11;

namespace {

constexpr size_t kErrLen = 8192;

struct StoreServer {
  void* handle = nullptr;
  int port = 0;
  // clients > 0: the job size, checked against the open-file limit at start.
  StoreServer(const std::string& host, int port_in, py::bytes secret, int clients) {
    std::string s = secret;
    char err[kErrLen] = {0};
    handle =
        hvdlite_store_server_start(host.c_str(), port_in, s.data(), s.size(), clients, &port, err, kErrLen);
    if (handle == nullptr) throw std::runtime_error(std::string("cannot start the rendezvous store: ") + err);
  }
  void Stop() {
    if (handle) {
      py::gil_scoped_release nogil;
      hvdlite_store_server_stop(handle);
      handle = nullptr;
    }
  }
  ~StoreServer() { Stop(); }
};

py::tuple Result(int code, const char* err) { return py::make_tuple(code, std::string(code ? err : "")); }

py::tuple Init() {
  char err[kErrLen] = {0};
  int code;
  {
    py::gil_scoped_release nogil;
    code = hvdlite_init(err, kErrLen);
  }
  return Result(code, err);
}

py::tuple Shutdown() {
  char err[kErrLen] = {0};
  int code;
  {
    py::gil_scoped_release nogil;
    code = hvdlite_shutdown(err, kErrLen);
  }
  return Result(code, err);
}

py::tuple Wait(int64_t handle, double timeout_s) {
  char err[kErrLen];
  err[0] = '\0';
  int code;
  {
    py::gil_scoped_release nogil;
    code = hvdlite_wait(handle, timeout_s, err, kErrLen);
  }
  return Result(code, err);
}

// Returns (code, message, bytes: uint8 ndarray owning the core's buffer, shape, received_splits, value).
py::tuple TakeOutput(int64_t handle) {
  hvdlite_output out{};
  char err[kErrLen] = {0};
  int code = hvdlite_take_output(handle, &out, err, kErrLen);
  if (code != 0) return py::make_tuple(code, std::string(err), py::none(), py::list(), py::list(), -1);
  std::vector<int64_t> shape(out.shape, out.shape + out.ndim);
  std::vector<int64_t> splits(out.received_splits, out.received_splits + out.nsplits);
  hvdlite_free_output(out.received_splits);
  py::object bytes = py::none();
  if (out.data != nullptr) {
    py::capsule owner(out.data, [](void* p) { hvdlite_free_output(p); });
    bytes = py::array_t<uint8_t>({static_cast<py::ssize_t>(out.nbytes)}, {1}, static_cast<uint8_t*>(out.data),
                                 owner);
  }
  return py::make_tuple(0, std::string(), bytes, shape, splits, out.value);
}

// (code, message, handle): a point-to-point send (kind 0) or recv (kind 1); see hvdlite_p2p.
py::tuple P2p(int32_t kind, const std::string& name, uintptr_t data, int64_t nbytes, int32_t peer,
              int32_t tag, int32_t process_set, int32_t device) {
  char err[kErrLen] = {0};
  int64_t handle = 0;
  int code;
  {
    py::gil_scoped_release nogil;  // a send may start moving its bytes here (Runtime::PostP2p)
    code = hvdlite_p2p(kind, name.c_str(), reinterpret_cast<void*>(data), nbytes, peer, tag, process_set,
                       device, &handle, err, kErrLen);
  }
  return py::make_tuple(code, std::string(code ? err : ""), handle);
}

py::tuple AddProcessSet(const std::vector<int32_t>& ranks, bool among_members) {
  char err[kErrLen] = {0};
  int32_t id = -1;
  int code;
  {
    py::gil_scoped_release nogil;
    code = hvdlite_add_process_set(ranks.data(), static_cast<int32_t>(ranks.size()), among_members ? 1 : 0,
                                   &id, err, kErrLen);
  }
  return py::make_tuple(code, std::string(code ? err : ""), id);
}

py::tuple RemoveProcessSet(int32_t id, bool among_members) {
  char err[kErrLen] = {0};
  int code;
  {
    py::gil_scoped_release nogil;
    code = hvdlite_remove_process_set(id, among_members ? 1 : 0, err, kErrLen);
  }
  return Result(code, err);
}

// None before init (or after shutdown).
py::object ProcessSetIds() {
  std::vector<int32_t> ids(256);
  int n = hvdlite_process_set_ids(ids.data(), static_cast<int32_t>(ids.size()));
  while (n > static_cast<int>(ids.size())) {
    ids.resize(static_cast<size_t>(n));
    n = hvdlite_process_set_ids(ids.data(), static_cast<int32_t>(ids.size()));
  }
  if (n < 0) return py::none();
  ids.resize(static_cast<size_t>(n));
  return py::cast(ids);
}

// Any number of ranks: asks again with a buffer of the reported size when the
// first one was too small (the set cannot change between the two calls of this
// thread, but a concurrent remove makes the second call return -1: None).
py::object ProcessSetRanks(int32_t id) {
  std::vector<int32_t> ranks(1024);
  int n = hvdlite_process_set_ranks(id, ranks.data(), static_cast<int32_t>(ranks.size()));
  while (n > static_cast<int>(ranks.size())) {
    ranks.resize(static_cast<size_t>(n));
    n = hvdlite_process_set_ranks(id, ranks.data(), static_cast<int32_t>(ranks.size()));
  }
  if (n < 0) return py::none();
  ranks.resize(static_cast<size_t>(n));
  return py::cast(ranks);
}

py::tuple StartTimeline(const std::string& path, bool mark_cycles) {
  char err[kErrLen] = {0};
  int code = hvdlite_start_timeline(path.c_str(), mark_cycles ? 1 : 0, err, kErrLen);
  return Result(code, err);
}

py::tuple StopTimeline() {
  char err[kErrLen] = {0};
  int code;
  {
    py::gil_scoped_release nogil;
    code = hvdlite_stop_timeline(err, kErrLen);
  }
  return Result(code, err);
}

py::dict BuildInfo() {
  py::dict d;
  std::string built = hvdlite_built_backends();
  for (const char* name : {"ring", "mpi"}) {
    d[name] = (("," + built + ",").find(std::string(",") + name + ",") != std::string::npos);
  }
  // NCCL and the CUDA kernels ship together in the separately built module.
  const bool gpu = hvdlite_gpu_module_installed() != 0;
  d["nccl"] = gpu;
  d["cuda"] = gpu;
  // Horovod's nccl_built() value: the NCCL_VERSION_CODE built against, 0 without the module.
  d["nccl_version"] = gpu ? HVDLITE_NCCL_VERSION_CODE : 0;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "hvdlite C++ core (see csrc/include/hvdlite/c_api.h)";
  hvdlite_py::RegisterSignKernels(m);
  m.def("init", &Init);
  m.def("shutdown", &Shutdown);
  m.def("is_initialized", [] { return hvdlite_is_initialized() != 0; });
  m.def("topology", &hvdlite_topology);
  // enqueue and submit_wait, the per-operation calls (raw CPython: op_calls.cc).
  // device: -1 host memory, else the CUDA device of `data`; stream: the framework's
  // cudaStream_t as an integer (0 = legacy default stream). See hvdlite_op in c_api.h.
  if (hvdlite_py::AddOpCalls(m.ptr()) != 0) throw py::error_already_set();
  m.def("poll", &hvdlite_poll);
  m.def("wait", &Wait);
  m.def("wait_begin", [](const std::vector<int64_t>& handles) {
    return hvdlite_wait_begin(handles.data(), static_cast<int32_t>(handles.size()));
  });
  m.def("wait_end", &hvdlite_wait_end);
  m.def("take_output", &TakeOutput);
  m.def("release", &hvdlite_release);
  m.def("p2p", &P2p);
  m.def("add_process_set", &AddProcessSet, py::arg("ranks"), py::arg("among_members") = false);
  m.def("remove_process_set", &RemoveProcessSet, py::arg("id"), py::arg("among_members") = false);
  m.def("process_set_ids", &ProcessSetIds);
  m.def("process_set_ranks", &ProcessSetRanks);
  m.def("build_info", &BuildInfo);
  m.def("mpi_enabled", [] { return hvdlite_mpi_enabled() != 0; });
  m.def("mpi_thread_level", &hvdlite_mpi_thread_level);
  m.def("start_timeline", &StartTimeline);
  m.def("stop_timeline", &StopTimeline);
  py::class_<StoreServer>(m, "TcpStoreServer")
      .def(py::init<const std::string&, int, py::bytes, int>(), py::arg("host"), py::arg("port"),
           py::arg("secret"), py::arg("clients") = 0)
      .def_property_readonly("port", [](const StoreServer& s) { return s.port; })
      .def("stop", &StoreServer::Stop);
  // (code, message, dict of counters): see hvdlite_stats in c_api.h.
  m.def("stats", [] {
    char err[kErrLen] = {0};
    hvdlite_stats s;
    int code = hvdlite_get_stats(&s, err, kErrLen);
    py::dict d;
    d["allreduce_responses"] = s.allreduce_responses;
    d["allreduce_tensors"] = s.allreduce_tensors;
    d["fused_responses"] = s.fused_responses;
    d["cache_entries"] = s.cache_entries;
    d["cache_evictions"] = s.cache_evictions;
    d["scheduled_responses"] = s.scheduled_responses;
    d["voted_responses"] = s.voted_responses;
    d["alltoall_bytes_sent"] = s.alltoall_bytes_sent;
    return py::make_tuple(code, std::string(code ? err : ""), d);
  });
}
