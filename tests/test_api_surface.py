"""hvdlite's public names against Horovod 0.28.1's, module by module.

tests/data/horovod_0.28.1_api.json holds the public names of horovod.torch, horovod.tensorflow,
horovod.tensorflow.keras and horovod.keras, read from Horovod's source at tag v0.28.1 (its
"source" entry names the repository, commit, files and the rule that picked the names). Each
Horovod module maps to the hvdlite module of the same path (horovod.X -> hvdlite.X).

A name Horovod has and hvdlite lacks fails the test unless it is listed in KNOWN_MISSING below,
with the reason it is still missing; the failure lists every unlisted missing name at once. A
listed name hvdlite now provides fails too, so the list only shrinks: delete it from the list when
you add the name. The Horovod-parity issues (9: Horovod semantics, 18: TensorFlow/Keras) fill
these gaps.
"""

import importlib
import json
import os

import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "horovod_0.28.1_api.json")
with open(DATA) as _f:
    HOROVOD = json.load(_f)

# hvdlite modules that do not exist yet at all; their names are compared once they do.
KNOWN_MISSING_MODULES = {
    "hvdlite.keras": "standalone Keras (horovod.keras) is not adapted yet (issue 18)",
}

KNOWN_MISSING = {
    "hvdlite.torch": [
        "check_extension",  # horovod.common.util helper re-exported by horovod.torch
    ],
    "hvdlite.tensorflow.keras": [
        "is_version_greater_equal_than",  # horovod.common.util helper
    ],
}

MODULES = sorted(HOROVOD["modules"])


def _hvdlite_module(horovod_name):
    return "hvdlite" + horovod_name[len("horovod") :]


def _import(name):
    """The hvdlite module, or None when it is listed as not existing yet (checked: it must not)."""
    pytest.importorskip("tensorflow" if "tensorflow" in name or "keras" in name else "torch")
    if name in KNOWN_MISSING_MODULES:
        with pytest.raises(ImportError):
            importlib.import_module(name)
        return None
    return importlib.import_module(name)


def test_data_file_names_its_source():
    src = HOROVOD["source"]
    assert src["repository"] == "https://github.com/horovod/horovod" and src["tag"] == "v0.28.1"
    assert len(src["commit"]) == 40 and set(src["files"]) == set(MODULES)
    assert all(len(HOROVOD["modules"][m]) > 30 for m in MODULES)  # not an empty or truncated list


@pytest.mark.parametrize("horovod_module", MODULES)
def test_every_horovod_name_is_provided_or_listed(horovod_module):
    name = _hvdlite_module(horovod_module)
    module = _import(name)
    if module is None:
        return
    listed = set(KNOWN_MISSING.get(name, []))
    missing = [n for n in HOROVOD["modules"][horovod_module] if not hasattr(module, n)]
    unlisted = [n for n in missing if n not in listed]
    assert not unlisted, (
        f"{name} lacks {len(unlisted)} public name(s) of {horovod_module} 0.28.1 that are not in "
        f"KNOWN_MISSING: {unlisted}"
    )


@pytest.mark.parametrize("horovod_module", MODULES)
def test_known_missing_lists_only_missing_names(horovod_module):
    name = _hvdlite_module(horovod_module)
    module = _import(name)
    listed = KNOWN_MISSING.get(name, [])
    assert len(set(listed)) == len(listed), f"duplicates in KNOWN_MISSING[{name!r}]"
    not_horovod = sorted(set(listed) - set(HOROVOD["modules"][horovod_module]))
    assert not not_horovod, f"KNOWN_MISSING[{name!r}] lists names Horovod lacks: {not_horovod}"
    if module is None:
        return
    provided = sorted(n for n in listed if hasattr(module, n))
    assert not provided, f"{name} now provides {provided}: remove them from KNOWN_MISSING"
