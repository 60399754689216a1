"""Builds hvdlite and its C++ core (hvdlite._core) through CMake.

The CMake build directory is build/ at the repo root and is reused, so a
rebuild after an edit compiles only what changed (make install runs it).
"""
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

    def run(self):
        # setuptools builds in-place / editable extensions under build/lib and then copies
        # only the extension itself into the source tree: copy our optional modules too.
        super().run()
        if self.inplace or getattr(self, "editable_mode", False):
            self._optional_dirs = [os.path.join(ROOT, "hvdlite")]
            self._install_optional(os.path.join(ROOT, "build"))

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
    entry_points={"console_scripts": ["hvdliterun = hvdlite.runner.launch:main"]},
)
