"""The core's headers define every enum that crosses the C ABI (op types, dtypes, reduce ops,
status codes); hvdlite's Python mirrors must match them name for name and value for value.
The headers are parsed here, so a value added or renumbered on one side fails this test."""

import pathlib
import re

import pytest

from hvdlite.common import dtypes, exceptions, ops

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"


def _enum_sources():
    return "\n".join(p.read_text() for p in sorted(CSRC.rglob("*.h")))


def header_enum(name, text=None):
    """{member name without its 'k' prefix: value} of `enum class name` in csrc/ headers."""
    text = _enum_sources() if text is None else text
    found = re.findall(r"enum\s+class\s+%s\b[^{]*\{(.*?)\};" % name, text, re.S)
    assert len(found) == 1, "enum class %s defined %d times in csrc/" % (name, len(found))
    body = " ".join(line.split("//")[0] for line in found[0].splitlines())
    members, value = {}, -1
    for item in (part.strip() for part in body.split(",")):
        if not item:
            continue
        m = re.fullmatch(r"k(\w+)(?:\s*=\s*(-?\d+))?", item)
        assert m, "cannot parse enum member %r of %s" % (item, name)
        value = int(m.group(2)) if m.group(2) is not None else value + 1
        members[m.group(1)] = value
    return members


def test_parser_reads_implicit_values():
    assert header_enum("E", "enum class E : int { kA = 3, kB, kC = 7 };") == {"A": 3, "B": 4, "C": 7}


def test_data_types():
    core = {name.lower(): value for name, value in header_enum("DataType").items()}
    assert core == dtypes.CODE_BY_NAME


def test_reduce_ops():
    core = {name.lower(): value for name, value in header_enum("ReduceOp").items()}
    assert core == {str(op).lower(): int(op) for op in dtypes.REDUCE_OPS}


@pytest.mark.parametrize(
    "name", ["ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"]
)
def test_op_types(name):
    core = {n.upper(): v for n, v in header_enum("OpType").items()}
    assert getattr(ops, name) == core[name]


def test_status_codes_and_their_exceptions():
    assert header_enum("StatusCode") == exceptions.STATUS_CODES
    assert set(exceptions.STATUS_CODES) - {"Ok"} == set(exceptions._BY_NAME)
    assert (header_enum("StatusCode")["Ok"], header_enum("StatusCode")["Timeout"]) == (
        exceptions.OK,
        exceptions.TIMEOUT,
    )
