"""hvdlite's modules import each other without cycles. Every import statement counts, also
those inside functions (a deferred import hides a cycle, it does not remove it); imports
under `if TYPE_CHECKING:` do not run and are skipped. Importing a module's own parent
package is how Python loads it, not a dependency."""

import ast

from python_imports import imported_names as _imported_names
from python_imports import modules as _modules


def _resolve(mods, name):
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _edges(mods):
    edges = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_names(mod, path, node):
                target = _resolve(mods, name)
                if target and target != mod and not mod.startswith(target + "."):
                    edges[mod].add(target)
    return edges


def _find_cycle(edges):
    """One cycle as a list of modules, or None (depth-first search, colouring)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return stack[stack.index(n) :] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_finder_sees_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_in_hvdlite():
    cycle = _find_cycle(_edges(_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
