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


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.join(ROOT, "build")
        os.makedirs(build_dir, exist_ok=True)
        subprocess.check_call(
            ["cmake", ROOT, "-DCMAKE_BUILD_TYPE=Release", "-DPython_EXECUTABLE=" + sys.executable],
            cwd=build_dir)
        jobs = os.environ.get("HVDLITE_BUILD_JOBS", "2")
        subprocess.check_call(["cmake", "--build", ".", "--target", "_core", "-j", jobs], cwd=build_dir)
        built = [f for f in os.listdir(build_dir) if f.startswith("_core") and f.endswith(".so")]
        if not built:
            raise RuntimeError("CMake produced no _core module in " + build_dir)
        source = os.path.join(build_dir, built[0])
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        # Never rewrite a module some process may have mapped: copy only when it
        # changed, and then by atomic rename (a loaded old copy stays valid).
        if os.path.exists(target) and filecmp.cmp(source, target, shallow=False):
            return
        shutil.copyfile(source, target + ".tmp")
        os.replace(target + ".tmp", target)


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
