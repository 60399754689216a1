"""The shape of csrc/transport, checked from its sources (no build needed).

The shared-memory transport steps its fallback / liveness transport through the neutral
SteppedTransport interface (csrc/transport/stepped.h) and knows nothing of the TCP transport's
internals: no shm_* file includes a tcp_* header or names a TCP identifier; only the factory in
transport.cc knows both. The per-operation state (a send or receive in progress: a peer, the
bytes moved, done) is declared once, in stepped.h, and shared by both transports."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSPORT = os.path.join(ROOT, "csrc", "transport")


def sources():
    """{file name: text} of every C++ source in csrc/transport."""
    out = {}
    for name in sorted(os.listdir(TRANSPORT)):
        if name.endswith((".h", ".cc")):
            with open(os.path.join(TRANSPORT, name)) as f:
                out[name] = f.read()
    return out


def code_only(text):
    """The text without comments and string literals (prose may say "TCP"; code may not)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def transport_includes(text):
    return re.findall(r'#include\s+"transport/([^"]+)"', text)


def struct_bodies(text):
    """[(name, body)] for every `struct Name {...}` in `text` (nested ones included)."""
    out = []
    for m in re.finditer(r"\bstruct\s+(\w+)\s*(?::[^{;]*)?\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.group(1), text[m.end() : i - 1]))
    return out


def is_op_state(body):
    """Per-operation state: a struct that holds the peer of one transfer and whether it is done."""
    return re.search(r"\bint\s+peer\b", body) and re.search(r"\bbool\s+done\b", body)


def test_shm_files_use_no_tcp_internals():
    src = sources()
    shm = [n for n in src if n.startswith("shm_")]
    assert shm, "no shm_* sources found in csrc/transport"
    for name in shm:
        tcp_includes = [h for h in transport_includes(src[name]) if h.startswith("tcp_")]
        assert not tcp_includes, f"{name} includes {tcp_includes}: use stepped.h's SteppedTransport"
        names = sorted(set(re.findall(r"\b\w*(?:Tcp|tcp_)\w*\b", code_only(src[name]))))
        assert not names, f"{name} names TCP transport internals {names}: use stepped.h's SteppedTransport"


def test_shm_transport_holds_a_stepped_transport():
    src = sources()
    header = code_only(src["shm_transport.h"])
    assert "stepped.h" in transport_includes(src["shm_transport.h"])
    assert re.search(r"std::unique_ptr<SteppedTransport>\s+\w+_;", header), (
        "ShmTransport should own its base transport as a std::unique_ptr<SteppedTransport>"
    )
    assert re.search(
        r"class\s+TcpTransport\s*(?:final\s*)?:\s*public\s+SteppedTransport\b", src["tcp_transport.h"]
    )


def test_stepped_interface_is_neutral():
    src = sources()
    stepped = src["stepped.h"]
    assert [h for h in transport_includes(stepped) if h.startswith(("tcp_", "shm_"))] == []
    assert not re.findall(r"\b\w*(?:Tcp|Shm|tcp_|shm_)\w*\b", code_only(stepped))


def test_only_the_factory_knows_both_transports():
    both = []
    for name, text in sources().items():
        inc = transport_includes(text)
        if any(h.startswith("tcp_") for h in inc) and any(h.startswith("shm_") for h in inc):
            both.append(name)
    assert both == ["transport.cc"], f"files that include both tcp_* and shm_* headers: {both}"


def test_per_operation_state_is_declared_once():
    declared = {}  # struct name -> file
    for name, text in sources().items():
        for struct, body in struct_bodies(code_only(text)):
            if is_op_state(body):
                declared.setdefault(struct, []).append(name)
    files = sorted({f for fs in declared.values() for f in fs})
    assert files == ["stepped.h"], f"per-operation state structs {declared} are declared in {files}"
    assert sorted(declared) == ["RecvOp", "SendOp"], f"per-operation state structs: {declared}"
