"""What hvdlite's Python modules import, read from their source with `ast` (nothing is
imported): shared by tests/test_import_cycles.py and tests/test_layering.py."""

import ast
import pathlib

import hvdlite

ROOT = pathlib.Path(hvdlite.__file__).parent


def modules():
    """{dotted module name: path} for every .py file of the hvdlite package."""
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def imported_names(mod, path, node):
    """The dotted names an Import / ImportFrom `node` of module `mod` (file `path`) names, with
    relative imports resolved: for `from a import b`, both `a` and `a.b` (b may be a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    return [base + "." + a.name for a in node.names] + [base]
