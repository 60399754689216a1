"""The one loader of hvdlite's compiled core, ``hvdlite._core`` (csrc/python/, built by
`make install`; what type checkers see of it: hvdlite/_core.pyi). Every Python module that
calls the core imports `core` from here, so a missing or stale build fails in one place, with
one message and one exception type: importing this module raises ExtensionNotBuiltError (an
ImportError, as Horovod's check_extension raises) naming the cause and the fix.
"""

from hvdlite.common.exceptions import ExtensionNotBuiltError

try:
    from hvdlite import _core as core
except ImportError as e:
    raise ExtensionNotBuiltError(
        "hvdlite's core (hvdlite._core) cannot be imported (%s); build it with `make install`" % e
    ) from e

__all__ = ["core"]
