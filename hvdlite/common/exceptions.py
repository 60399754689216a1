"""The one exception family of hvdlite, and the mapping from core status codes.

Every failure the core reports becomes an ``HvdliteError`` (a ``RuntimeError``)
or one of its subclasses. Horovod's names are kept as aliases so code written
against Horovod catches the same things.

Where Horovod raises one of Python's own exceptions, the hvdlite error raised in
the same situation also subclasses that builtin, so ``except <builtin>:`` written
for Horovod still catches it (tests/test_error_family.py checks each row):

  Horovod raises          situation (Horovod)                       hvdlite error
  TimeoutError            Ray placement group not ready in time     HvdliteTimeoutError
                          (horovod/ray/strategy.py)
  ValueError              bad argument, not initialized, a name     InvalidArgumentError,
                          in flight, a duplicate process set        PreconditionError
  ValueError              init failed ("Horovod initialization      InitError, InitTimeoutError
                          failed")                                  (init_error_for)
  NotImplementedError     a feature the build or backend lacks      NotSupportedError
  AssertionError          zero_grad() before step(), too many       CallOrderError
                          backward passes
  IndexError              a dispatcher id out of range              OutOfRangeError
  ImportError             the extension is not built; a framework   ExtensionNotBuiltError,
                          version mismatch                          HorovodVersionMismatchError
  RuntimeError            HorovodInternalError, HostsUpdated-       HvdliteError and every
                          Interrupt, launcher and rendezvous        subclass
                          failures
"""


class HvdliteError(RuntimeError):
    """Base class of every error hvdlite raises."""


class HvdliteInternalError(HvdliteError):
    """The job can no longer run collectives: a rank died, hung, or shut down.

    Horovod raises ``HorovodInternalError`` in the same situations; elastic
    training catches it to recover.
    """


class HvdliteTimeoutError(HvdliteInternalError, TimeoutError):
    """A bounded wait expired (a stalled tensor, a peer that stopped responding, a Ray placement
    group that did not become ready). Also Python's TimeoutError, which Horovod raises where a
    Ray placement group is not ready in time; still a HorovodInternalError (a RuntimeError) for
    elastic training. TimeoutError is an OSError: hvdlite code catches OSError only around its
    own socket and file calls, never around a wait that raises this."""


class InitError(HvdliteInternalError, ValueError):
    """hvd.init() could not form the job (the store unreachable or refusing this rank, a peer
    that failed while joining). Horovod raises ValueError("Horovod initialization failed") for
    any failed init, so this is also a ValueError; still a HorovodInternalError."""


class InitTimeoutError(InitError, HvdliteTimeoutError):
    """hvd.init()'s bounded wait for the other ranks expired (HVDLITE_START_TIMEOUT): an
    InitError (a ValueError, as Horovod's) and an HvdliteTimeoutError (Python's TimeoutError)."""


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


class HorovodVersionMismatchError(HvdliteError, ImportError):
    """Horovod's error for a framework whose version differs from the one Horovod was built
    against (an ImportError there and here). hvdlite's core has no framework headers and serves
    every framework version, so hvdlite never raises it; it exists so code that imports or
    catches it by name (horovod.common.exceptions) keeps working."""

    def __init__(self, name, version, installed_version):
        super().__init__(
            "Framework %s installed with version %s but found version %s" % (name, installed_version, version)
        )
        self.name, self.version, self.installed_version = name, version, installed_version


class HostsUpdatedInterrupt(HvdliteError):
    """Raised by elastic training when the set of hosts changed (Horovod's name; a
    RuntimeError there and here, through HvdliteError)."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class ShardsLostError(HvdliteError):
    """Elastic training cannot rebuild sharded state in memory: a rank and the peer keeping its
    buddy copy were lost together (or a commit was cut short). Not an HvdliteInternalError, so
    hvd.elastic.run does not retry it; the fix is to restart from a disk checkpoint."""


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


def init_error_for(code, message):
    """The exception (not raised) for a non-zero status of init(): error_for's, made a
    ValueError as Horovod's failed init is (InitError, InitTimeoutError) unless it is one
    already (InvalidArgumentError, PreconditionError) or names a missing feature
    (NotSupportedError)."""
    err = error_for(code, message)
    if isinstance(err, (ValueError, NotImplementedError)):
        return err
    return (InitTimeoutError if code == TIMEOUT else InitError)(message)
