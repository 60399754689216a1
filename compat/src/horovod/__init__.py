"""Horovod's `horovod` package, provided by hvdlite (distribution hvdlite-horovod-compat).

`import horovod.torch as hvd`, `horovod.tensorflow`, `horovod.tensorflow.keras`, `horovod.keras`
and `horovod.common.exceptions` are hvdlite's modules themselves (see _alias.py), and
`horovodrun` is hvdliterun with Horovod's flags (horovod.runner.launch); horovod.run() launches a
function on N ranks through it (horovod.runner). Importing this package
fails with ImportError when a real Horovod distribution is installed on the same path.
"""

from horovod import _alias, _guard

_found = _guard.real_horovod()
if _found is not None:
    raise ImportError(_guard.refusal(_found))

_alias.install()

# The Horovod API level hvdlite implements (scripts compare it); hvdlite's own version is
# hvdlite.__version__ where it has one.
__version__ = "0.28.1"

from horovod.runner import run  # noqa: E402  (after the guard; Horovod's horovod.run)
