"""Builds hvdlite and its C++ core (hvdlite._core) through CMake.

The CMake build directory is build/ at the repo root and is reused, so a
rebuild after an edit compiles only what changed (make install runs it).
"""
import json
import os
import filecmp
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


OPTIONAL_MODULES = ("libhvdlite_cuda.so",)  # the NCCL module, built where CUDA and NCCL are found
TF_OPS_SOURCE = os.path.join(ROOT, "hvdlite", "tensorflow", "await_op.cc")
TF_OPS_LIB = "_hvdlite_tf_ops.so"  # installed in hvdlite/tensorflow/ (hvdlite/tensorflow/await_op.py loads it)


def _tf_framework_lib():
    """Path of the installed TensorFlow's framework library (found without importing
    TensorFlow, which takes seconds), or None."""
    import importlib.util
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = os.path.join(list(spec.submodule_search_locations)[0], "libtensorflow_framework.so.2")
    return lib if os.path.exists(lib) else None


def _local_static_runtime_flag():
    """The linker flag CMakeLists.txt sets as HVDLITE_LOCAL_STATIC_RUNTIME (the one place it is
    written; its comment there says why): a statically linked libstdc++ stays local to our
    modules."""
    import re
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        found = re.search(r'set\(HVDLITE_LOCAL_STATIC_RUNTIME "([^"]+)"\)', f.read())
    if found is None:
        raise RuntimeError("CMakeLists.txt no longer sets HVDLITE_LOCAL_STATIC_RUNTIME")
    return found.group(1)


def _build_tf_ops(build_dir):
    """Builds the TensorFlow await kernel (hvdlite/tensorflow/await_op.cc) against the
    installed TensorFlow into build_dir; returns its path, or None (with a message) when
    TensorFlow or the compiler is missing or fails: hvdlite.tensorflow then runs graph-mode
    collectives on the blocking path. The core never depends on it."""
    framework = _tf_framework_lib()
    out = os.path.join(build_dir, TF_OPS_LIB)
    if framework is None:
        print("hvdlite: TensorFlow is not installed: no TensorFlow await kernel")
        return None
    newest_input = max(os.path.getmtime(TF_OPS_SOURCE), os.path.getmtime(framework))
    if os.path.exists(out) and os.path.getmtime(out) >= newest_input:
        return out
    query = ("import json, tensorflow as tf; "
             "print(json.dumps(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()))")
    try:
        res = subprocess.run([sys.executable, "-c", query], capture_output=True, text=True, timeout=600)
        flags = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        flags = None
    if flags is None:
        print("hvdlite: TensorFlow's build flags are unavailable: no TensorFlow await kernel")
        return None
    cmd = [os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations",
           _local_static_runtime_flag(),
           "-I" + os.path.join(ROOT, "csrc", "include"), TF_OPS_SOURCE, "-o", out + ".tmp"] + flags
    try:
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired) as e:
        print("hvdlite: building the TensorFlow await kernel failed (%s)" % e)
        return None
    if built.returncode != 0:
        print("hvdlite: building the TensorFlow await kernel failed:\n" + built.stderr[-3000:])
        return None
    os.replace(out + ".tmp", out)
    return out


def _cmake_options():
    """-D options from the environment, each passed on every configure so that a value
    unset again returns to its default (CMake's cache would otherwise keep the last one):
    HVDLITE_WITH_MPI / HVDLITE_WITH_CUDA = auto|0|1, HVDLITE_CUDA_ARCHS (default "90"),
    NCCL_ROOT (default: found through `import nvidia.nccl`)."""
    env = os.environ
    return ["-DHVDLITE_WITH_MPI=" + env.get("HVDLITE_WITH_MPI", "auto"),
            "-DHVDLITE_WITH_CUDA=" + env.get("HVDLITE_WITH_CUDA", "auto"),
            "-DHVDLITE_CUDA_ARCHS=" + env.get("HVDLITE_CUDA_ARCHS", "90"),
            "-DNCCL_ROOT=" + env.get("NCCL_ROOT", "")]


def _install(source, target):
    """Never rewrites a module some process may have mapped: copies only when it changed,
    and then by atomic rename (a loaded old copy stays valid)."""
    if os.path.exists(target) and filecmp.cmp(source, target, shallow=False):
        return
    shutil.copyfile(source, target + ".tmp")
    os.replace(target + ".tmp", target)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.join(ROOT, "build")
        os.makedirs(build_dir, exist_ok=True)
        subprocess.check_call(
            ["cmake", ROOT, "-DCMAKE_BUILD_TYPE=Release", "-DPython_EXECUTABLE=" + sys.executable]
            + _cmake_options(), cwd=build_dir)
        jobs = os.environ.get("HVDLITE_BUILD_JOBS", "2")
        subprocess.check_call(["cmake", "--build", ".", "--target", "hvdlite_modules", "-j", jobs], cwd=build_dir)
        built = [f for f in os.listdir(build_dir) if f.startswith("_core") and f.endswith(".so")]
        if not built:
            raise RuntimeError("CMake produced no _core module in " + build_dir)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _install(os.path.join(build_dir, built[0]), target)
        self._optional_dirs = [os.path.dirname(target)]
        self._install_optional(build_dir)
        self._install_tf_ops(build_dir)

    def run(self):
        # setuptools builds in-place / editable extensions under build/lib and then copies
        # only the extension itself into the source tree: copy our optional modules too.
        super().run()
        if self.inplace or getattr(self, "editable_mode", False):
            self._optional_dirs = [os.path.join(ROOT, "hvdlite")]
            self._install_optional(os.path.join(ROOT, "build"))
            self._install_tf_ops(os.path.join(ROOT, "build"))

    def _install_tf_ops(self, build_dir):
        """Installs the TensorFlow await kernel into hvdlite/tensorflow/ beside the package's
        Python files, or removes a stale copy when it could not be built."""
        lib = _build_tf_ops(build_dir)
        for d in self._optional_dirs:
            installed = os.path.join(d, "tensorflow", TF_OPS_LIB)
            if lib is not None:
                os.makedirs(os.path.dirname(installed), exist_ok=True)
                _install(lib, installed)
            elif os.path.exists(installed):
                os.remove(installed)

    def _install_optional(self, build_dir):
        """Installs the optional modules this configuration built beside the extension, and
        removes copies an earlier configuration left there."""
        with open(os.path.join(build_dir, "hvdlite_optional_modules.txt")) as f:
            wanted = set(f.read().split())
        for d in self._optional_dirs:
            for name in OPTIONAL_MODULES:
                installed = os.path.join(d, name)
                if name in wanted:
                    _install(os.path.join(build_dir, name), installed)
                elif os.path.exists(installed):
                    os.remove(installed)

setup(
    name="hvdlite",
    version="0.1.0",
    description="Distributed training for PyTorch, TensorFlow and NumPy with a Horovod-compatible API",
    packages=find_packages(include=["hvdlite", "hvdlite.*"]),
    ext_modules=[CMakeExtension("hvdlite._core")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    # hvdlite.spark.run (Spark barrier mode: BarrierTaskContext.allGather needs Spark 3.0+);
    # hvdlite.ray.RayExecutor (placement groups and scheduling strategies: Ray 2.x).
    # hvdlite.ray.train.HvdliteConfig: Ray Train (ray[train]).
    extras_require={"spark": ["pyspark>=3.0"], "ray": ["ray[train]>=2.0"]},
    entry_points={"console_scripts": ["hvdliterun = hvdlite.runner.launch:main"]},
)
