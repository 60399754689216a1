"""The maps of the repository stay true to the tree (no ranks, no build needed).

docs/architecture.md: every repository path it names in backticks exists, and it names every
top-level folder that git tracks and every folder under csrc/ and hvdlite/. A backticked token
counts as a path when it contains a '/' and is made only of path characters (letters, digits,
'_', '-', '.', '/', and '*' for a glob), e.g. `csrc/transport/` or `hvdlite/torch/optimizer.py`.

README.md's "Repository layout" section: it gives every docs/*.md and every benchmark entry point
(benchmarks/*.py not starting with '_') a line of its own, starting with the file's name."""

import glob
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARCH = REPO / "docs" / "architecture.md"
PATH_TOKEN = re.compile(r"^(?!\.\.?/)(?!/)[A-Za-z0-9_.*\-]+(?:/[A-Za-z0-9_.*\-]*)+$")


def _backticked_paths(text):
    """Every backticked token of `text` that is a repository path, without a trailing '/'."""
    tokens = re.findall(r"`([^`\n]+)`", text)
    return sorted({t.rstrip("/") for t in tokens if PATH_TOKEN.match(t)})


def _tracked_folders():
    """Folders that hold a file git tracks, as repository-relative paths with '/' separators."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the folders git tracks are unknown")
    folders = set()
    for path in out.decode().split("\0"):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folders.add("/".join(parts[:i]))
    return folders


def _readme_layout():
    text = (REPO / "README.md").read_text()
    match = re.search(r"^## Repository layout\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "README.md has no '## Repository layout' section"
    return match.group(1)


def test_paths_named_in_architecture_exist():
    missing = []
    for path in _backticked_paths(ARCH.read_text()):
        found = glob.glob(str(REPO / path)) if "*" in path else (REPO / path).exists()
        if not found:
            missing.append(path)
    assert missing == [], (
        "docs/architecture.md names paths that do not exist; fix or remove them:\n  " + "\n  ".join(missing)
    )


def test_architecture_names_every_folder():
    named = set(_backticked_paths(ARCH.read_text()))
    folders = _tracked_folders()
    wanted = sorted(f for f in folders if "/" not in f or f.startswith("csrc/") or f.startswith("hvdlite/"))
    unnamed = [f for f in wanted if f not in named]
    assert unnamed == [], (
        "docs/architecture.md does not name these folders; add each, in backticks with its trailing "
        "'/' (e.g. `csrc/transport/`), where the page describes what it holds and what it may use:\n  "
        + "\n  ".join(f + "/" for f in unnamed)
    )


def _listed(section, name):
    """True when some line of the section starts (after indentation) with `name`."""
    return any(line.strip().split(" ")[0] in (name, name + ":") for line in section.splitlines())


def test_readme_layout_lists_every_doc_and_benchmark():
    section = _readme_layout()
    docs = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    scripts = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))
    missing = ["docs/" + d for d in docs if not _listed(section, d)]
    missing += ["benchmarks/" + s for s in scripts if not _listed(section, s)]
    assert missing == [], (
        "README.md's 'Repository layout' section lacks a line for each of these; add one per file, "
        "under its folder, starting with the file name and saying what it is:\n  " + "\n  ".join(missing)
    )


def test_readme_layout_names_only_existing_files():
    """A line of the section that starts with a file name (docs, benchmarks, examples) names a real file."""
    stale = []
    for line in _readme_layout().splitlines():
        first = line.strip().split(" ")[0].rstrip(":")
        named_file = re.fullmatch(r"[\w.\-]+\.(md|py)", first)
        if named_file and not any((REPO / d / first).exists() for d in ("docs", "benchmarks", "examples")):
            stale.append(first)
    assert stale == [], "README.md's 'Repository layout' lists files that do not exist:\n  " + "\n  ".join(
        stale
    )
