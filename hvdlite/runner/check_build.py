"""`hvdliterun --check-build`: what this installation supports, in Horovod's format.

Frameworks are checked without importing them (importlib.util.find_spec): a framework is
available when both it and its hvdlite adapter module are installed. Backends come from the
core's build_info() dict, e.g. {"ring": True, "mpi": False, "nccl": False, "cuda": False}.
"""

import importlib.util

# (label, framework module, hvdlite adapter module)
FRAMEWORKS = (
    ("NumPy", "numpy", "hvdlite"),
    ("PyTorch", "torch", "hvdlite.torch"),
    ("TensorFlow", "tensorflow", "hvdlite.tensorflow"),
)
# (section, [(label, build_info key)])
BACKEND_SECTIONS = (
    ("Available Controllers", [("Ring (TCP rendezvous)", "ring"), ("MPI", "mpi")]),
    ("Available Tensor Operations", [("Ring", "ring"), ("MPI", "mpi"), ("NCCL", "nccl")]),
    ("Available GPU Support", [("CUDA", "cuda")]),
)


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False  # a parent package that fails to import, or a broken spec


def _build_info():
    """(build_info dict, error text or None)."""
    try:
        from hvdlite.common.native import core as _core

        return dict(_core.build_info()), None
    except Exception as e:  # not built, or an old core without build_info
        return {}, "%s: %s" % (type(e).__name__, e)


def _version():
    try:
        from importlib.metadata import version

        return version("hvdlite")
    except Exception:
        return "unknown"


def _mark(ok):
    return "[X]" if ok else "[ ]"


def build_report():
    info, error = _build_info()
    lines = ["hvdlite v%s:" % _version(), "", "Available Frameworks:"]
    for label, framework, adapter in FRAMEWORKS:
        ok = not error and _installed(framework) and _installed(adapter)
        lines.append("    %s %s" % (_mark(ok), label))
    for section, entries in BACKEND_SECTIONS:
        lines += ["", section + ":"]
        for label, key in entries:
            lines.append("    %s %s" % (_mark(bool(info.get(key))), label))
    if error:
        lines += ["", "The core (hvdlite._core) is not usable: " + error, "Build it with `make install`."]
    return "\n".join(lines)
