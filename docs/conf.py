"""Sphinx configuration of hvdlite's documentation site (`make docs`: docs/_build/html/).

The pages are docs/*.md (MyST Markdown) plus an API reference that docs/apigen.py writes into
docs/api/ from the public names of hvdlite's namespaces when the build starts. `make docs` builds
with warnings as errors and then checks every internal link of the HTML (docs/check_links.py)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this tree's hvdlite, not an installed one
sys.path.insert(0, HERE)

import apigen  # noqa: E402
from sphinx.domains.python import PyClasslike  # noqa: E402

project = "hvdlite"
author = "the hvdlite authors"
copyright = "the hvdlite authors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Docstrings write code in single backticks (`tensor`): show it as code.
default_role = "literal"
# Quotes and dashes as the docstrings and pages type them.
smartquotes = False

# Markdown pages link to each other's sections by GitHub's heading slugs.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# A method without a docstring of its own (a Keras callback's on_epoch_end) is not hvdlite's API:
# it is left out rather than shown with its base class's docstring.
autodoc_inherit_docstrings = False
autosummary_generate = False  # the pages come from apigen; autosummary only draws their tables

html_theme = "alabaster"
html_title = "hvdlite"
html_static_path = []


class PublicPathClass(PyClasslike):
    """py:class / py:exception without autodoc's `:canonical:` option: a class re-exported by
    several namespaces (hvdlite.ProcessSet, hvdlite.torch.ProcessSet) is listed under each public
    path, and under no file-level path (which would be the same name twice, and would change when
    a module moves)."""

    def run(self):
        self.options.pop("canonical", None)
        return super().run()


def setup(app):
    app.add_directive_to_domain("py", "class", PublicPathClass, override=True)
    app.add_directive_to_domain("py", "exception", PublicPathClass, override=True)
    app.connect("builder-inited", lambda app: apigen.write_pages(os.path.join(app.srcdir, "api")))
