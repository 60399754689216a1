"""The API reference's pages, written from the public names of hvdlite's namespaces when the docs
build starts (docs/conf.py connects `write_pages` to Sphinx's builder-inited event).

A namespace's public names are its ``__all__`` where it has one, else every name of ``dir()``
(module ``__getattr__``/``__dir__`` lazy names included) that does not start with '_', is not a
module and is defined by hvdlite. Each is documented under its public import path (for example
``hvdlite.torch.parallel.ZeroOptimizer``), never under the file that defines it, so moving a
module within a package changes no page. tests/test_docs_site.py checks the built inventory
against `public_names`.
"""

import argparse
import contextlib
import importlib
import inspect
import io
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's hvdlite

# (namespace, title line). The order is the reference's table of contents.
NAMESPACES = [
    ("hvdlite", "the framework-neutral NumPy API (``import hvdlite as hvd``)"),
    ("hvdlite.torch", "the PyTorch API, a drop-in for horovod.torch"),
    ("hvdlite.torch.parallel", "``hvd.parallel``: ZeRO, tensor, context, pipeline and expert parallelism"),
    ("hvdlite.torch.elastic", "elastic training for PyTorch"),
    (
        "hvdlite.torch_backend",
        "torch.distributed's ``hvdlite`` backend (``dist.init_process_group(\"hvdlite\")``)",
    ),
    ("hvdlite.parallel", "framework-neutral model-parallel building blocks (the mesh)"),
    ("hvdlite.elastic", "elastic training, framework-neutral"),
    ("hvdlite.tensorflow", "the TensorFlow API, a drop-in for horovod.tensorflow"),
    ("hvdlite.tensorflow.elastic", "elastic training for TensorFlow"),
    ("hvdlite.tensorflow.keras", "the Keras API, a drop-in for horovod.tensorflow.keras"),
    ("hvdlite.tensorflow.keras.callbacks", "Horovod's Keras callbacks"),
    ("hvdlite.tensorflow.keras.elastic", "elastic training for Keras"),
    ("hvdlite.runner", "the ``hvdliterun`` launcher"),
    ("hvdlite.ray", "hvdlite on Ray"),
    ("hvdlite.spark", "hvdlite on Spark"),
]

# Entry points documented beside a namespace that has no public Python names of its own.
EXTRA = {"hvdlite.runner": [("hvdlite.runner.launch", "main")]}


def _defined_by_hvdlite(obj):
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return (getattr(obj, "__module__", None) or "").startswith("hvdlite")
    return type(obj).__module__.startswith("hvdlite")


def public_names(namespace):
    """Sorted public names of the module `namespace` (see the module docstring)."""
    module = importlib.import_module(namespace)
    declared = getattr(module, "__all__", None)
    names = list(declared) if declared is not None else [n for n in dir(module) if not n.startswith("_")]
    out = []
    for name in sorted(set(names)):
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            continue
        if declared is None and not _defined_by_hvdlite(obj):
            continue
        out.append(name)
    return out


def undocumented(namespace):
    """The public classes and functions of `namespace` without a docstring of their own."""
    module = importlib.import_module(namespace)
    out = []
    for name in public_names(namespace):
        obj = getattr(module, name)
        if (inspect.isclass(obj) or callable(obj)) and not (obj.__doc__ or "").strip():
            out.append(name)
    return out


def _directive(obj):
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "autoexception", [":members:"]
        return "autoclass", [":members:"]
    if inspect.isroutine(obj) or callable(obj):
        return "autofunction", []
    return "autodata", [":no-value:"]


def _cli_help():
    """`hvdliterun --help`, as the launcher prints it."""
    from hvdlite.runner.launch import parse_args

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parse_args(["--help"])
    return out.getvalue()


def _page(namespace, title):
    module = importlib.import_module(namespace)
    heading = "``%s``: %s" % (namespace, title)
    lines = [heading, "=" * len(heading), "", ".. automodule:: %s" % namespace, "   :no-members:", ""]
    lines += [".. currentmodule:: %s" % namespace, ""]
    names = public_names(namespace)
    if names:
        lines += [".. autosummary::", ""] + ["   %s" % n for n in names] + [""]
    for name in names:
        directive, options = _directive(getattr(module, name))
        lines += [".. %s:: %s" % (directive, name)] + ["   %s" % o for o in options] + [""]
    if namespace == "hvdlite.runner":
        lines += ["The ``hvdliterun`` command", "--------------------------", "", ".. code-block:: text", ""]
        lines += ["   " + line if line else "" for line in _cli_help().splitlines()] + [""]
    for module_name, name in EXTRA.get(namespace, []):
        lines += [".. autofunction:: %s.%s" % (module_name, name), ""]
    return "\n".join(lines)


def _write_if_changed(path, text):
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)


def write_pages(out_dir):
    """Writes api/index.rst and one api/<namespace>.rst per namespace under `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    index = [
        "API reference",
        "=============",
        "",
        "Every public name, under the path users import it from.",
        "",
    ]
    index += [".. toctree::", "   :maxdepth: 1", ""] + ["   %s" % ns for ns, _ in NAMESPACES] + [""]
    _write_if_changed(os.path.join(out_dir, "index.rst"), "\n".join(index))
    for namespace, title in NAMESPACES:
        _write_if_changed(os.path.join(out_dir, namespace + ".rst"), _page(namespace, title))


def main():
    parser = argparse.ArgumentParser(description="Write the API reference's .rst pages.")
    parser.add_argument("out_dir", nargs="?", help="where to write them")
    parser.add_argument(
        "--list",
        action="store_true",
        help="print, as JSON, every documented name and those without a docstring",
    )
    args = parser.parse_args()
    if args.list:
        names = {ns: public_names(ns) for ns, _ in NAMESPACES}
        for ns, extra in EXTRA.items():
            names[ns] = names[ns] + ["%s.%s" % pair for pair in extra]
        missing = {ns: undocumented(ns) for ns, _ in NAMESPACES}
        print(json.dumps({"names": names, "undocumented": {ns: m for ns, m in missing.items() if m}}))
    elif args.out_dir:
        write_pages(args.out_dir)
    else:
        parser.error("give out_dir or --list")


if __name__ == "__main__":
    main()
