"""The layering of docs/architecture.md, checked: csrc/ folders include only the layers below them
(so there is no include cycle), and the CMake build's per-layer
link check turns a call from a layer into a layer above it (a back edge) into a link error.

The checks are the ones of the shared tool import_cycles.py, restated here so that the test
suite needs nothing outside the repository. hvdlite/'s import cycles: tests/test_import_cycles.py."""

import os
import re
import subprocess

import pytest
import python_imports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
BUILD = os.path.join(ROOT, "build")

# Bottom to top (docs/architecture.md); `include` is the C header of the ABI, `python` its binding.
CSRC_LAYERS = [
    "include",
    "common",
    "rendezvous",
    "transport",
    "algorithms",
    "backend",
    "coordinator",
    "runtime",
]
CSRC_TOP = ["python"]  # may include anything below


def csrc_edges():
    """{folder: {included folder: [files that include it]}} over csrc/'s top-level folders."""
    folders = {d for d in os.listdir(CSRC) if os.path.isdir(os.path.join(CSRC, d))}
    edges = {}
    for folder in folders:
        for dirpath, _, files in os.walk(os.path.join(CSRC, folder)):
            for name in files:
                with open(os.path.join(dirpath, name), errors="ignore") as f:
                    text = f.read()
                for inc in re.findall(r'#include\s+"([^"/]+)/', text):
                    if inc in folders and inc != folder:
                        rel = os.path.relpath(os.path.join(dirpath, name), CSRC)
                        edges.setdefault(folder, {}).setdefault(inc, []).append(rel)
    return edges


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_csrc_include_cycle():
    graph = {a: set(b) for a, b in csrc_edges().items()}
    assert cycles(graph) == [], "include cycles between csrc/ folders"


def test_csrc_folders_include_only_lower_layers():
    order = {name: i for i, name in enumerate(CSRC_LAYERS + CSRC_TOP)}
    bad = []
    for folder, targets in sorted(csrc_edges().items()):
        assert folder in order, (
            "csrc/%s is in no layer: add it to CSRC_LAYERS (and docs/architecture.md)" % folder
        )
        for target, files in sorted(targets.items()):
            if order[target] >= order[folder]:
                bad.append("%s -> %s (%s)" % (folder, target, ", ".join(sorted(files))))
    assert bad == [], "back edges in the csrc/ layering:\n" + "\n".join(bad)


# ---- the link-time layering check (CMakeLists.txt: <layer>_check) ----


def _cache_path(key):
    """A FILEPATH entry of build/CMakeCache.txt."""
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        return re.search(r"^%s:FILEPATH=(.*)$" % key, f.read(), re.M).group(1)


def _compiler():
    return _cache_path("CMAKE_CXX_COMPILER")


def _link_layer(tmp_path, extra_source, whole, below):
    """Links a shared library as CMake's layer check does: `whole` archives whole (plus the
    object of `extra_source`, a stand-in for one more file of that layer) against only the
    archives `below`, with --no-undefined. Returns the finished process."""
    cxx = _compiler()
    src = tmp_path / "extra.cc"
    src.write_text(extra_source)
    obj = tmp_path / "extra.o"
    subprocess.run(
        [cxx, "-std=c++17", "-fPIC", "-I", CSRC, "-c", str(src), "-o", str(obj)], check=True, timeout=120
    )
    archives = lambda names: [os.path.join(BUILD, "libhvdlite_%s.a" % n) for n in names]  # noqa: E731
    cmd = [cxx, "-shared", "-o", str(tmp_path / "check.so"), "-Wl,--no-undefined", str(obj)]
    cmd += (
        ["-Wl,--whole-archive"]
        + archives(whole)
        + ["-Wl,--no-whole-archive"]
        + archives(below)
        + [_cache_path("OPENSSL_CRYPTO_LIBRARY"), "-pthread"]  # common's one outside dependency
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


# A transport file calling into algorithms (the layer above transport).
BACK_EDGE = """
#include "algorithms/reduce_kernels.h"
namespace hvdlite {
Status TransportBackEdge(void* buf) { return ScaleBuffer(buf, 1, DataType::kFloat32, 2.0); }
}
"""


def _needs_build():
    for layer in ("common", "rendezvous", "transport", "algorithms"):
        if not os.path.exists(os.path.join(BUILD, "libhvdlite_%s.a" % layer)):
            pytest.skip(
                "the CMake build tree build/ is missing the layer libraries: run `make install` first"
            )


def test_every_layer_has_a_link_check():
    _needs_build()
    checks = set(os.listdir(os.path.join(BUILD, "layer_check")))
    for layer in CSRC_LAYERS[1:]:
        assert "liblayer_check_hvdlite_%s.so" % layer in checks, "no link check for csrc/%s" % layer


def test_a_back_edge_fails_to_link(tmp_path):
    _needs_build()
    run = _link_layer(tmp_path, BACK_EDGE, ["transport"], ["rendezvous", "common"])
    assert run.returncode != 0, "a transport -> algorithms call linked without algorithms"
    assert "ScaleBuffer" in run.stderr, run.stderr[-2000:]


def test_the_same_call_links_from_the_layer_above(tmp_path):
    _needs_build()
    run = _link_layer(tmp_path, BACK_EDGE, ["transport"], ["algorithms", "transport", "rendezvous", "common"])
    assert run.returncode == 0, run.stderr[-3000:]


# ---- the Python layering (docs/architecture.md, "Layers") ----
#
# hvdlite/common (framework-neutral) < the adapters (numpy_ops, torch, torch_backend, tensorflow) < the add-ons
# (hvdlite/parallel, hvdlite/torch/parallel). An adapter never imports an add-on when it is
# imported (a lazy attribute that imports on first use is fine), `common` never names an adapter,
# TensorFlow does not build on the NumPy adapter, and the compiled core has one loader module.

ADAPTERS = ("hvdlite.numpy_ops", "hvdlite.torch", "hvdlite.torch_backend", "hvdlite.tensorflow")
ADDONS = ("hvdlite.parallel", "hvdlite.torch.parallel")
CORE_LOADER = "hvdlite.common.native"


def _python_files():
    return sorted(python_imports.modules().items())


def _imports(mod, path, top_level_only):
    """Module names `mod` (file `path`) imports: every import statement, or only those that run
    when the module is imported (not inside a function or class body), and string arguments of
    importlib.import_module / __import__ calls anywhere."""
    import ast

    names = []

    def visit(node, nested):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            nested = True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (top_level_only and nested):
            names.extend(python_imports.imported_names(mod, path, node))
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.append(node.args[0].value)
        for child in ast.iter_child_nodes(node):
            visit(child, nested)

    visit(ast.parse(path.read_text(), str(path)), False)
    return names


def _under(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_adapters_do_not_import_addons_at_import_time():
    bad = []
    for mod, path in _python_files():
        if _under(mod, ADAPTERS) and not _under(mod, ADDONS):
            bad += ["%s imports %s" % (mod, n) for n in _imports(mod, path, True) if _under(n, ADDONS)]
    assert bad == [], "an adapter imports the add-on layer at import time:\n" + "\n".join(bad)


def test_importing_the_torch_adapter_loads_no_addon():
    code = (
        "import sys, hvdlite.torch as hvd\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(%r))\n"
        "assert not loaded, loaded\n"
        "assert hvd.parallel.ZeroOptimizer is hvd.ZeroOptimizer and hvd.Mesh.__name__ == 'Mesh'\n"
    ) % (ADDONS,)
    pytest.importorskip("torch")
    run = subprocess.run(
        [__import__("sys").executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_common_never_names_an_adapter_or_addon():
    bad = []
    for mod, path in _python_files():
        if _under(mod, ("hvdlite.common",)):
            names = _imports(mod, path, False)
            bad += ["%s imports %s" % (mod, n) for n in names if _under(n, ADAPTERS + ADDONS)]
    assert bad == [], "hvdlite/common reaches up into an adapter:\n" + "\n".join(bad)


def test_tensorflow_does_not_build_on_the_numpy_adapter():
    bad = []
    for mod, path in _python_files():
        if _under(mod, ("hvdlite.tensorflow",)):
            bad += [
                "%s imports %s" % (mod, n)
                for n in _imports(mod, path, False)
                if _under(n, ("hvdlite.numpy_ops",))
            ]
    assert bad == [], "hvdlite.tensorflow uses the NumPy adapter (use hvdlite.common):\n" + "\n".join(bad)


def test_the_core_has_one_loader_module():
    bad = []
    for mod, path in _python_files():
        if mod != CORE_LOADER:
            bad += [
                "%s imports %s" % (mod, n)
                for n in _imports(mod, path, False)
                if _under(n, ("hvdlite._core",))
            ]
    assert bad == [], "import the core through %s:\n%s" % (CORE_LOADER, "\n".join(bad))


# ---- the add-ons' layout (docs/architecture.md, "Add-ons") ----
#
# hvdlite/torch/parallel/ holds one package per technique and no loose technique modules; every
# public name of a technique is importable from its package and from hvd.parallel.

TECHNIQUES = ("zero", "tensor", "cp", "pipeline", "moe", "sparse", "mesh")
TORCH_ADDON = os.path.join(ROOT, "hvdlite", "torch", "parallel")


def test_torch_parallel_is_a_package_per_technique():
    entries = sorted(e for e in os.listdir(TORCH_ADDON) if e != "__pycache__")
    assert entries == sorted(("__init__.py",) + TECHNIQUES), (
        "hvdlite/torch/parallel/ holds one package per technique and its __init__.py only; "
        "put a new module into its technique's package: %s" % entries
    )
    prefixed = []
    for dirpath, _, files in os.walk(TORCH_ADDON):
        prefixed += [
            os.path.join(dirpath, f) for f in files if f.endswith(".py") and f.split("_")[0] in TECHNIQUES
        ]
    assert prefixed == [], "a module name carries its technique as a prefix: %s" % prefixed


def test_each_technique_package_exports_its_public_names():
    pytest.importorskip("torch")
    import importlib

    parallel = importlib.import_module("hvdlite.torch.parallel")
    exported = set()
    for technique in TECHNIQUES:
        package = importlib.import_module("hvdlite.torch.parallel." + technique)
        for name in package.__all__:
            assert getattr(parallel, name) is getattr(package, name), (technique, name)
        exported |= set(package.__all__)
    missing = sorted(set(parallel.__all__) - exported)
    assert missing == [], "hvd.parallel names that no technique package exports: %s" % missing
