"""hvdlite/_core.pyi (what mypy sees of the compiled module) names exactly what the module has."""

import ast
import pathlib

import hvdlite
from hvdlite import _core


def test_stub_matches_the_compiled_module():
    stub = ast.parse((pathlib.Path(hvdlite.__file__).parent / "_core.pyi").read_text())
    declared = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    built = {name for name in dir(_core) if not name.startswith("_")}
    assert declared == built
