"""The layering of docs/architecture.md, checked: csrc/ folders include only the layers below them
(so there is no include cycle), and the CMake build's per-layer
link check turns a call from a layer into a layer above it (a back edge) into a link error.

The checks are the ones of the shared tool import_cycles.py, restated here so that the test
suite needs nothing outside the repository. hvdlite/'s import cycles: tests/test_import_cycles.py."""

import os
import re
import subprocess

import pytest

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


def _compiler():
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        return re.search(r"^CMAKE_CXX_COMPILER:FILEPATH=(.*)$", f.read(), re.M).group(1)


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
        + ["-pthread"]
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
