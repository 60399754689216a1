"""The import hook that makes `horovod.X` the very module object `hvdlite.Y`.

Contract: for each name under an aliased prefix (ALIASES), `import horovod.<prefix>.<rest>`
imports `hvdlite.<target>.<rest>` and binds that same module object under the horovod name in
sys.modules and as an attribute of its horovod parent. No module is loaded twice, so a Horovod
script shares hvdlite's runtime, classes and exception family (`horovod.torch is hvdlite.torch`).
The aliased module keeps its own __name__, __spec__ and __file__. Names under an aliased prefix
that hvdlite lacks fail with a ModuleNotFoundError that says so; all other horovod.* names
(horovod.common, horovod.runner) are real modules of this distribution.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence

# Horovod module name -> hvdlite module name; submodules follow their prefix (horovod.torch.mpi_ops
# -> hvdlite.torch.mpi_ops). horovod.keras is Horovod's Keras API, which for Keras 3 on TensorFlow
# is hvdlite.tensorflow.keras (the same module object as horovod.tensorflow.keras).
ALIASES = {
    "horovod.torch": "hvdlite.torch",
    "horovod.tensorflow": "hvdlite.tensorflow",
    "horovod.keras": "hvdlite.tensorflow.keras",
    "horovod.common.exceptions": "hvdlite.common.exceptions",
    "horovod.common.process_sets": "hvdlite.common.process_sets",
    "horovod.spark": "hvdlite.spark",
    "horovod.ray": "hvdlite.ray",
}


def target_of(name: str) -> str | None:
    """The hvdlite module name that Horovod module `name` stands for, or None when `name` is not
    under an aliased prefix."""
    for prefix, target in ALIASES.items():
        if name == prefix or name.startswith(prefix + "."):
            return target + name[len(prefix) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads one alias: create_module imports the hvdlite module and returns it; the import
    system then stamps the alias's spec on it, which exec_module puts back."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # the hvdlite module's own spec (importlib.reload needs it)

    def get_code(self, fullname: str) -> types.CodeType | None:
        """The hvdlite module's code: what `python -m horovod.<module>` runs as __main__ (runpy
        asks the loader for it; e.g. horovod.tensorflow.data.compute_worker)."""
        spec = importlib.util.find_spec(self.target)
        get_code = getattr(spec.loader, "get_code", None) if spec is not None else None
        return get_code(self.target) if get_code is not None else None


class AliasFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path, so that it answers before the path finder could load a second
    copy of an hvdlite file under a horovod name."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        hvdlite_name = target_of(fullname)
        if hvdlite_name is None:
            return None
        loaded = sys.modules.get(hvdlite_name)
        found = getattr(loaded, "__spec__", None)
        if loaded is None:
            try:
                found = importlib.util.find_spec(hvdlite_name)
            except ModuleNotFoundError:
                found = None
            if found is None:
                raise ModuleNotFoundError(
                    "No module named %r: hvdlite's Horovod compatibility namespace maps it to %r, "
                    "which hvdlite does not have" % (fullname, hvdlite_name),
                    name=fullname,
                )
        # origin: the hvdlite file, which `python -m horovod.<module>` shows as sys.argv[0].
        origin = getattr(found, "origin", None)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(hvdlite_name), origin=origin)


def install() -> None:
    """Puts one AliasFinder first on sys.meta_path (idempotent)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
