"""Detects a real Horovod distribution, which this compatibility namespace must never shadow.

Standard library only: setup.py runs this file before anything is built, and
horovod/__init__.py runs it on every import.
"""

import importlib.metadata

# This distribution's own name: every other distribution named `horovod` is the real Horovod.
COMPAT_DIST = "hvdlite-horovod-compat"


def real_horovod():
    """A one-line description of the installed real Horovod distribution, or None when there is
    none on this interpreter's path."""
    try:
        dist = importlib.metadata.distribution("horovod")
    except importlib.metadata.PackageNotFoundError:
        return None
    where = getattr(dist, "_path", None)  # the .dist-info / .egg-info directory, where known
    version = dist.version or "?"
    return "horovod %s%s" % (version, " (%s)" % where if where else "")


def refusal(found, action="run"):
    """The message for a refused `action` (run, install) over `found` (real_horovod()'s text)."""
    return (
        "hvdlite's Horovod compatibility namespace refuses to %s over a real Horovod: %s is "
        "installed on this Python path. Both provide the `horovod` package, and one would silently "
        "replace the other. Uninstall one of them (`pip uninstall horovod` or `pip uninstall %s`), "
        "or use `import hvdlite.torch as hvd` directly." % (action, found, COMPAT_DIST)
    )
