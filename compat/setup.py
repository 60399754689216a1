"""Builds hvdlite-horovod-compat, the `horovod` package and `horovodrun` over hvdlite.

Refuses to build (so pip refuses to install) when a real Horovod is installed: on this
interpreter's path, and on the target interpreter's own path as `python -I` sees it (pip's build
isolation hides the target's site-packages from this process). horovod/__init__.py checks again
on every import, for installs that bypass this check (a wheel built elsewhere).
"""

import os
import runpy
import subprocess
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
GUARD = os.path.join(HERE, "src", "horovod", "_guard.py")


def _refuse_over_real_horovod():
    guard = runpy.run_path(GUARD)
    found = guard["real_horovod"]()
    if found is None:
        probe = "import runpy, sys; r = runpy.run_path(sys.argv[1])['real_horovod'](); print(r or '')"
        out = subprocess.run([sys.executable, "-I", "-c", probe, GUARD], capture_output=True, text=True)
        found = out.stdout.strip() or None
    if found is not None:
        sys.exit("error: " + guard["refusal"](found, "install"))


_refuse_over_real_horovod()

setup(
    name="hvdlite-horovod-compat",
    version="0.28.1",
    description="The `horovod` package and `horovodrun` command, provided by hvdlite (opt-in)",
    package_dir={"": "src"},
    packages=find_packages("src", include=["horovod", "horovod.*"]),
    python_requires=">=3.10",
    install_requires=["hvdlite"],
    entry_points={"console_scripts": ["horovodrun = horovod.runner.launch:main"]},
)
