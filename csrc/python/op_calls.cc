// hvdlite._core.enqueue and submit_wait: the two calls every collective makes
// (submit_wait for each blocking in-place one, enqueue for each asynchronous
// one), written against the CPython API with METH_FASTCALL instead of
// pybind11. pybind11's dispatch converts 13-14 arguments through its generic
// casters (a std::string and a std::vector per call) and tries overloads;
// that was ~0.5 us of a 4 KiB allreduce's ~3.7 us. Here the arguments are read
// in place: the name as the str's cached UTF-8, the shape into a small array.
// Same signatures, conversions and results as the pybind11 versions had
// (ints and floats accept __index__ / __float__; a bad argument raises
// TypeError / OverflowError).
#include "python/op_calls.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "hvdlite/c_api.h"

namespace hvdlite_py {
namespace {

constexpr size_t kErrLen = 8192;

// The arguments shared by both calls, in order: type, name, data, dtype,
// shape, reduce_op, prescale, postscale, root, splits, process_set, device,
// stream. `op` points into `shape` and `splits` (and the name's str).
struct OpArgs {
  hvdlite_op op{};
  std::vector<int64_t> shape, splits;
};

bool ToInt64(PyObject* o, int64_t* out) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) return false;
  *out = v;
  return true;
}

bool ToInt32(PyObject* o, int32_t* out) {
  int64_t v = 0;
  if (!ToInt64(o, &v)) return false;
  if (v < INT32_MIN || v > INT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "hvdlite: integer argument out of range");
    return false;
  }
  *out = static_cast<int32_t>(v);
  return true;
}

bool ToDouble(PyObject* o, double* out) {
  *out = PyFloat_AsDouble(o);
  return !(*out == -1.0 && PyErr_Occurred());
}

// A sequence of ints (tuple, list, torch.Size) into `out`.
bool ToInt64s(PyObject* o, std::vector<int64_t>* out) {
  PyObject* seq = PySequence_Fast(o, "hvdlite: expected a sequence of ints");
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out->resize(static_cast<size_t>(n));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < n; ++i) ok = ToInt64(items[i], &(*out)[static_cast<size_t>(i)]);
  Py_DECREF(seq);
  return ok;
}

// The address of `data`: an integer (a framework's data_ptr()), or an object
// with the buffer protocol whose memory is contiguous (a NumPy array).
bool ToAddress(PyObject* data, void** out) {
  if (PyLong_Check(data)) {
    *out = PyLong_AsVoidPtr(data);
    return !(*out == nullptr && PyErr_Occurred());
  }
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0) return false;
  *out = view.buf;
  PyBuffer_Release(&view);
  return true;
}

// args[0..12] (device and stream optional: -1 and 0) into *a.
bool ParseOp(PyObject* const* args, Py_ssize_t nargs, const char* fn, OpArgs* a) {
  if (nargs < 11 || nargs > 13) {
    PyErr_Format(PyExc_TypeError, "%s() takes 11 to 13 operation arguments (%zd given)", fn, nargs);
    return false;
  }
  hvdlite_op& op = a->op;
  Py_ssize_t name_len = 0;
  if (!PyUnicode_Check(args[1])) {
    PyErr_Format(PyExc_TypeError, "%s(): name must be a str", fn);
    return false;
  }
  op.name = PyUnicode_AsUTF8AndSize(args[1], &name_len);
  int64_t stream = 0;
  op.device = -1;
  if (op.name == nullptr || !ToInt32(args[0], &op.type) || !ToAddress(args[2], &op.data) ||
      !ToInt32(args[3], &op.dtype) || !ToInt64s(args[4], &a->shape) || !ToInt32(args[5], &op.reduce_op) ||
      !ToDouble(args[6], &op.prescale) || !ToDouble(args[7], &op.postscale) || !ToInt32(args[8], &op.root) ||
      !ToInt64s(args[9], &a->splits) || !ToInt32(args[10], &op.process_set) ||
      (nargs > 11 && !ToInt32(args[11], &op.device)) || (nargs > 12 && !ToInt64(args[12], &stream)))
    return false;
  op.shape = a->shape.data();
  op.ndim = static_cast<int32_t>(a->shape.size());
  op.splits = a->splits.empty() ? nullptr : a->splits.data();
  op.nsplits = static_cast<int32_t>(a->splits.size());
  op.stream = reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
  return true;
}

// (code, message[, extra...]) as a new tuple; null with the error set when out of memory.
PyObject* Result(int code, const char* message, std::initializer_list<int64_t> extra) {
  PyObject* t = PyTuple_New(2 + static_cast<Py_ssize_t>(extra.size()));
  if (t == nullptr) return nullptr;
  PyTuple_SET_ITEM(t, 0, PyLong_FromLong(code));
  PyTuple_SET_ITEM(t, 1, PyUnicode_FromString(message));
  Py_ssize_t i = 2;
  for (int64_t v : extra) PyTuple_SET_ITEM(t, i++, PyLong_FromLongLong(v));
  for (Py_ssize_t k = 0; k < i; ++k) {
    if (PyTuple_GET_ITEM(t, k) == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
  }
  return t;
}

// enqueue(type, name, data, dtype, shape, reduce_op, prescale, postscale, root,
// splits, process_set, device=-1, stream=0[, output, output_nbytes]) -> (code, message, handle).
// With output (an address or a contiguous buffer): hvdlite_enqueue_into.
// The error buffer is not zeroed: the C ABI always writes a terminated message.
PyObject* Enqueue(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  OpArgs a;
  void* output = nullptr;
  int64_t output_nbytes = 0;
  if (nargs == 15) {
    if (!ToAddress(args[13], &output) || !ToInt64(args[14], &output_nbytes)) return nullptr;
    nargs = 13;
  }
  if (!ParseOp(args, nargs, "enqueue", &a)) return nullptr;
  int64_t handle = 0;
  char err[kErrLen];
  err[0] = '\0';
  const int code = output != nullptr
                       ? hvdlite_enqueue_into(&a.op, output, output_nbytes, &handle, err, kErrLen)
                       : hvdlite_enqueue(&a.op, &handle, err, kErrLen);
  return Result(code, code ? err : "", {handle});
}

// submit_wait(<enqueue's 13 arguments>, slice_s) -> None | (code, message, handle, token):
// enqueue, register the wait (deadlock detector), and wait up to `slice_s`
// with the GIL released once. None when the operation is over and succeeded
// (the common case: no tuple to build). Otherwise handle 0 when it is over
// with an error (the core handle released, the wait ended; code/message are
// the enqueue's or the wait's); else the operation is still pending after
// the slice, and the caller goes on waiting on `handle` as after enqueue +
// wait_begin (ops._wait_one), then calls wait_end(token) and release.
PyObject* SubmitWait(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 14) {
    PyErr_Format(PyExc_TypeError, "submit_wait() takes 14 arguments (%zd given)", nargs);
    return nullptr;
  }
  OpArgs a;
  double slice_s = 0;
  if (!ParseOp(args, 13, "submit_wait", &a) || !ToDouble(args[13], &slice_s)) return nullptr;
  int64_t handle = 0;
  int64_t token = 0;
  char err[kErrLen];
  err[0] = '\0';
  int code;
  Py_BEGIN_ALLOW_THREADS;
  code = hvdlite_submit_wait(&a.op, slice_s, &handle, &token, err, kErrLen);
  Py_END_ALLOW_THREADS;
  if (code == 0 && handle == 0) Py_RETURN_NONE;
  // Still pending after the slice: the code says so (a timeout), with no message.
  return Result(code, code && handle == 0 ? err : "", {handle, token});
}

PyMethodDef kOpCalls[] = {
    {"enqueue", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Enqueue)), METH_FASTCALL,
     "enqueue(type, name, data, dtype, shape, reduce_op, prescale, postscale, root, splits, process_set, "
     "device=-1, stream=0[, output, output_nbytes]) -> (code, message, handle)"},
    {"submit_wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(SubmitWait)), METH_FASTCALL,
     "enqueue + wait_begin + one wait slice (+ wait_end + release when done) -> (code, message, handle, "
     "token)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int AddOpCalls(PyObject* module) { return PyModule_AddFunctions(module, kOpCalls); }

}  // namespace hvdlite_py
