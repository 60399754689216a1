"""The one exception family of hvdlite, and the mapping from core status codes.

Every failure the core reports becomes an ``HvdliteError`` (a ``RuntimeError``)
or one of its subclasses. Horovod's names are kept as aliases so code written
against Horovod catches the same things.
"""


class HvdliteError(RuntimeError):
    """Base class of every error hvdlite raises."""


class HvdliteInternalError(HvdliteError):
    """The job can no longer run collectives: a rank died, hung, or shut down.

    Horovod raises ``HorovodInternalError`` in the same situations; elastic
    training catches it to recover.
    """


class HvdliteTimeoutError(HvdliteInternalError):
    """A bounded wait expired (a stalled tensor or a peer that stopped responding)."""


class InvalidArgumentError(HvdliteError, ValueError):
    """This rank passed something the operation cannot take."""


class MismatchError(HvdliteInternalError):
    """Ranks submitted the same tensor name with different shapes, dtypes, ops or roots.

    A HorovodInternalError (and so a RuntimeError), as Horovod reports it: the failed
    collective surfaces from synchronize() there, and elastic training treats it as a
    reset."""


class NotSupportedError(HvdliteError, NotImplementedError):
    """The operation or dtype is not available in this build or backend (also a
    NotImplementedError, which Horovod raises for missing features)."""


class PreconditionError(HvdliteError, ValueError):
    """Called in the wrong state: not initialized, a name already in flight, a process set
    already registered. Also a ValueError, which Horovod raises in these cases ("Horovod has
    not been initialized", duplicate in-flight names, duplicate process sets)."""


class OutOfRangeError(HvdliteError, IndexError):
    """An index outside its range (a dispatcher id of the tf.data compute service); also an
    IndexError, which Horovod raises in that case."""


class CallOrderError(PreconditionError, AssertionError):
    """An API was called in an order that would race or lose work (zero_grad() between
    backward and step(), more backward passes than backward_passes_per_step); also an
    AssertionError, which Horovod raises in these cases."""


class ExtensionNotBuiltError(HvdliteError, ImportError):
    """hvdlite's core extension cannot be loaded (also an ImportError, which Horovod's
    check_extension raises)."""


class HostsUpdatedInterrupt(HvdliteError):
    """Raised by elastic training when the set of hosts changed (Horovod's name; a
    RuntimeError there and here, through HvdliteError)."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


# Horovod's names.
HorovodInternalError = HvdliteInternalError

# The core's StatusCode (csrc/common/status.h), by name without its 'k';
# tests/test_enums_match_core.py checks names and values against the header.
STATUS_CODES = {
    "Ok": 0,
    "InvalidArgument": 1,
    "Mismatch": 2,
    "Aborted": 3,
    "Timeout": 4,
    "NotSupported": 5,
    "Precondition": 6,
    "Internal": 7,
}
_BY_NAME = {
    "InvalidArgument": InvalidArgumentError,
    "Mismatch": MismatchError,
    "Aborted": HvdliteInternalError,
    "Timeout": HvdliteTimeoutError,
    "NotSupported": NotSupportedError,
    "Precondition": PreconditionError,
    "Internal": HvdliteInternalError,
}
_BY_CODE = {STATUS_CODES[name]: cls for name, cls in _BY_NAME.items()}
OK = STATUS_CODES["Ok"]
TIMEOUT = STATUS_CODES["Timeout"]


def error_for(code, message):
    """The exception (not raised) for a non-zero core status code; unknown codes give
    HvdliteError."""
    return _BY_CODE.get(code, HvdliteError)(message)


def raise_for_status(code, message):
    """Raises the exception for a non-zero core status code."""
    if code != OK:
        raise error_for(code, message)
