"""Every exception hvdlite raises belongs to one family: HvdliteError and its subclasses
(each with the built-in base Horovod uses for that case: ValueError, NotImplementedError,
AssertionError, ...). Checked on the source with `ast`, so no code path is missed:

  - `raise Name(...)`, `raise Name`, `raise module.Name(...)`: Name must be a family class
    (a class defined in hvdlite deriving from HvdliteError, or an alias of one);
  - `raise` and `raise exc` (a lower-case name: an exception object caught earlier) are
    re-raises and fine;
  - `raise error_for(code, message)`: the core-status factory, whose classes are checked below;
  - `raise AttributeError(...)` in a module's or class's `__getattr__`: Python's attribute
    protocol, which expects exactly that type (a lazy attribute, hvdlite/torch/__init__.py).
"""

import ast
import pathlib

import hvdlite
from hvdlite.common import exceptions

PACKAGE = pathlib.Path(hvdlite.__file__).parent
FACTORIES = {
    "error_for",
    "init_error_for",
    "tf_error",
    "unsupported_dtype",  # hvdlite/common/buffer.py: a NotSupportedError naming the tensor and its dtype
}  # tf_error: the error itself, or a subclass of its class


def _name(node):
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _trees():
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _family(trees):
    """Names of the classes (and aliases) in hvdlite that derive from HvdliteError."""
    bases, aliases = {}, {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {_name(b) for b in node.bases}
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        aliases[target.id] = node.value.id
    family = {"HvdliteError"}
    while True:
        grown = {c for c, bs in bases.items() if bs & family} | {a for a, v in aliases.items() if v in family}
        if grown <= family:
            return family
        family |= grown


def _attribute_protocol_raises(tree):
    """The `raise AttributeError` nodes inside __getattr__ functions of `tree`."""
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__":
            for node in ast.walk(fn):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                    if _name(target) == "AttributeError":
                        out.add(node)
    return out


def _violations(trees, family):
    bad = []
    for path, tree in trees.items():
        allowed = _attribute_protocol_raises(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None or node in allowed:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = _name(target)
            if isinstance(node.exc, ast.Name) and name[:1].islower():
                continue  # re-raise of a caught exception object
            if name in family or (isinstance(node.exc, ast.Call) and name in FACTORIES):
                continue
            bad.append(
                "%s:%d raise %s" % (path.relative_to(PACKAGE.parent), node.lineno, ast.unparse(target))
            )
    return bad


def test_every_raise_is_in_the_hvdlite_error_family():
    trees = _trees()
    bad = _violations(trees, _family(trees))
    assert not bad, "raises outside the HvdliteError family:\n" + "\n".join(bad)


def test_status_code_errors_are_in_the_family():
    for code in list(exceptions._BY_CODE) + [99]:
        err = exceptions.error_for(code, "message")
        assert isinstance(err, exceptions.HvdliteError) and str(err) == "message"


def test_horovod_names_and_builtin_bases():
    assert exceptions.HorovodInternalError is exceptions.HvdliteInternalError
    assert issubclass(exceptions.HostsUpdatedInterrupt, exceptions.HvdliteError)
    assert issubclass(exceptions.HostsUpdatedInterrupt, RuntimeError)
    assert issubclass(exceptions.InvalidArgumentError, ValueError)
    assert issubclass(exceptions.NotSupportedError, NotImplementedError)
    assert issubclass(exceptions.CallOrderError, AssertionError)
    # Horovod: "not initialized", a duplicate in-flight name and a duplicate process set are
    # ValueErrors; a collective that fails across ranks is a HorovodInternalError.
    assert issubclass(exceptions.PreconditionError, ValueError)
    assert issubclass(exceptions.MismatchError, exceptions.HorovodInternalError)
    assert issubclass(exceptions.MismatchError, RuntimeError)
    assert issubclass(exceptions.HvdliteTimeoutError, exceptions.HorovodInternalError)
    # Horovod raises Python's TimeoutError where a Ray placement group is not ready in time
    # (tests/test_ray.py raises it for real), IndexError for a dispatcher id out of range,
    # ImportError for a missing extension or a framework version mismatch.
    assert issubclass(exceptions.HvdliteTimeoutError, TimeoutError)
    assert issubclass(exceptions.OutOfRangeError, IndexError)
    assert issubclass(exceptions.ExtensionNotBuiltError, ImportError)
    err = exceptions.HorovodVersionMismatchError("torch", "2.1", "2.0")
    assert isinstance(err, ImportError) and (err.name, err.version, err.installed_version) == (
        "torch",
        "2.1",
        "2.0",
    )
    assert isinstance(exceptions.error_for(exceptions.TIMEOUT, "m"), TimeoutError)
    for name in ("Mismatch", "Aborted", "Timeout", "Internal"):
        err = exceptions.error_for(exceptions.STATUS_CODES[name], "m")
        assert isinstance(err, exceptions.HorovodInternalError), name


def test_a_failed_init_is_a_value_error_as_horovods():
    """Horovod raises ValueError("Horovod initialization failed") for any failed init."""
    for name, code in exceptions.STATUS_CODES.items():
        if name != "Ok":
            err = exceptions.init_error_for(code, "m")
            assert isinstance(err, exceptions.HvdliteError) and str(err) == "m", name
            assert isinstance(err, (ValueError, NotImplementedError)), name
    timeout = exceptions.init_error_for(exceptions.TIMEOUT, "m")
    assert isinstance(timeout, exceptions.InitTimeoutError) and isinstance(timeout, TimeoutError)
    assert isinstance(timeout, exceptions.HorovodInternalError)
    assert type(exceptions.init_error_for(exceptions.STATUS_CODES["InvalidArgument"], "m")) is (
        exceptions.InvalidArgumentError
    )


_INIT_ALONE = """
import os
from hvdlite.common.native import core
secret = os.urandom(32)
server = core.TcpStoreServer("127.0.0.1", 0, secret)
os.environ.update(HVDLITE_RANK="0", HVDLITE_SIZE="2", HVDLITE_STORE_ADDR="127.0.0.1:%d" % server.port,
                  HVDLITE_SECRET=secret.hex(), HVDLITE_START_TIMEOUT="1")
import hvdlite
caught, message = [], ""
for kind in (ValueError, TimeoutError, hvdlite.HorovodInternalError):
    try:
        hvdlite.init()
    except kind as e:
        caught.append(type(e).__name__)
        message = str(e)
print("CAUGHT", caught, message)
"""


def test_init_whose_peer_never_joins_raises_horovods_builtin():
    """A real rank 0 of 2 whose rank 1 never starts: init() ends after HVDLITE_START_TIMEOUT with
    an error that `except ValueError` (Horovod's), `except TimeoutError` and `except
    HorovodInternalError` all catch, naming the missing rank."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _INIT_ALONE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "CAUGHT ['InitTimeoutError', 'InitTimeoutError', 'InitTimeoutError']" in run.stdout, run.stdout
    assert "rank 1" in run.stdout, run.stdout


def test_torch_exposes_the_same_classes():
    import hvdlite.torch as hvd

    assert hvd.HorovodInternalError is exceptions.HorovodInternalError
    assert hvd.MismatchError is exceptions.MismatchError
    try:
        raise exceptions.error_for(exceptions.STATUS_CODES["Mismatch"], "shape mismatch")
    except hvd.HorovodInternalError as e:
        assert str(e) == "shape mismatch"
