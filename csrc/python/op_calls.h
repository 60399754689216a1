// The per-operation calls of hvdlite._core (enqueue, submit_wait), written
// against the CPython API (op_calls.cc says why).
#pragma once
#include <Python.h>

namespace hvdlite_py {

// Adds enqueue and submit_wait to `module`; 0, or -1 with a Python error set.
int AddOpCalls(PyObject* module);

}  // namespace hvdlite_py
