"""hvdliterun's host list and rank layout (hvdlite/runner/hosts.py), and how a remote rank's
command line is built (hvdlite/runner/remote.py): pure functions, no hosts needed."""

import shlex
import socket

import pytest

from hvdlite.common.exceptions import InvalidArgumentError
from hvdlite.runner import hosts, remote


def test_parse_hosts_and_hostfile(tmp_path):
    assert hosts.parse_hosts("a:2, b ,c:1") == [("a", 2), ("b", 1), ("c", 1)]
    f = tmp_path / "hostfile"
    f.write_text("# cluster\na slots=4\n\nb   slots=2 # fast one\nc\n")
    assert hosts.parse_hostfile(str(f)) == [("a", 4), ("b", 2), ("c", 1)]
    for bad in ("", "a:0", "a:x", ":2"):
        with pytest.raises(InvalidArgumentError):
            hosts.parse_hosts(bad)


def test_layout_is_host_major_with_horovods_cross_ranks():
    out = hosts.layout(hosts.parse_hosts("a:2,b:3,c:1"), 5)
    assert [(s.rank, s.host, s.local_rank, s.local_size) for s in out] == [
        (0, "a", 0, 2),
        (1, "a", 1, 2),
        (2, "b", 0, 3),
        (3, "b", 1, 3),
        (4, "b", 2, 3),
    ]
    # local_rank 0 and 1 exist on a and b; local_rank 2 only on b. Host c got no rank.
    assert [(s.cross_rank, s.cross_size) for s in out] == [(0, 2), (0, 2), (1, 2), (1, 2), (0, 1)]
    with pytest.raises(InvalidArgumentError, match="more than the 6 slot"):
        hosts.layout(hosts.parse_hosts("a:2,b:3,c:1"), 7)


def test_is_local():
    assert hosts.is_local("localhost") and hosts.is_local("127.0.0.1")
    assert hosts.is_local(socket.gethostname())
    assert not hosts.is_local("192.0.2.1")  # TEST-NET-1: never this machine
    assert not hosts.is_local("no-such-host.invalid")


def test_remote_command_carries_the_environment_but_not_the_secret():
    env = {
        "HVDLITE_RANK": "3",
        "HVDLITE_SECRET": "ab" * 32,
        "A_B": "x y'z",
        "HOME": "/root",
        "SSH_AUTH_SOCK": "s",
    }
    line = remote.remote_command(["python", "train.py", "--lr", "0.1 0.2"], env, cwd="/data/my job")
    words = shlex.split(line)
    assert "HVDLITE_RANK=3" in words and "A_B=x y'z" in words
    assert not any(w.startswith(("HVDLITE_SECRET", "HOME=", "SSH_")) for w in words)
    assert "ab" * 32 not in line
    assert words[:2] == ["cd", "/data/my job"]
    assert words[-4:] == ["python", "train.py", "--lr", "0.1 0.2"]
    argv = remote.SshOptions(port=2222, identity_file="/k").argv("h")
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and argv[-1] == "h"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k"


def test_mpi_args_may_start_with_our_own_short_options():
    from hvdlite.runner.launch import parse_args

    args = parse_args(["--mpi", "-np", "4", "--mpi-args", "-H a:2,b:2", "python", "t.py", "--mpi-args", "-p"])
    assert (args.mpi_args, args.hosts) == ("-H a:2,b:2", None)
    assert args.command == ["python", "t.py", "--mpi-args", "-p"]
    args = parse_args(["-np", "2", "-H", "a:1,b:1", "-p", "2222", "python", "-i", "x"])
    assert (args.hosts, args.ssh_port, args.ssh_identity_file) == ("a:1,b:1", 2222, None)
    assert args.command == ["python", "-i", "x"]
